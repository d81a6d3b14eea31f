package execd

import (
	"sync"

	"github.com/opensandbox/opensandbox/execd/cgroup"
	"github.com/opensandbox/opensandbox/execd/process"
)

// setUpOOMScores makes the processes execd starts the OOM killer's first
// choice: each gets Config.ChildOOMScoreAdj (1000 by default) before it
// runs, while execd keeps the score its container was given.
//
// execd does not lower its own score, even where it could (with
// CAP_SYS_RESOURCE). Within the sandbox's memory cgroup, where a sandbox
// that fills its own limit meets the OOM killer, the children's +1000
// already ranks every one of them ahead of execd. Against the rest of the
// host, the container's score is the platform's choice (Docker's
// --oom-score-adj, the kubelet's QoS classes) and a sandbox's init should
// not outrank its neighbours on its own authority. And a privileged write
// would also lower the minimum that processes inherit from execd, a
// protection a process forked before its own score is raised could keep.
func (s *Server) setUpOOMScores() {
	adj := s.cfg.ChildOOMScoreAdj
	if adj == -1 {
		return
	}
	var once sync.Once
	s.sup.SetChildOOMScore(adj, func(pid int, err error) {
		once.Do(func() {
			s.log.Warn("a process execd started keeps execd's OOM score (logged once)", "pid", pid, "err", err)
		})
	})
	own, err := process.ReadOOMScore(0)
	switch {
	case err != nil:
		s.log.Warn("read execd's own OOM score", "err", err)
	case own >= adj:
		s.log.Warn("execd's own oom_score_adj is already at least what its processes get: the OOM killer may take execd first (give the sandbox a memory request, or a lower score)",
			"execd", own, "processes", adj)
	default:
		s.log.Debug("OOM scores", "execd", own, "processes", adj)
	}
}

// spoolWriters bounds the log writes of background commands under way at
// once (see threads.go).
const spoolWriters = 2

// defaultLogBudget is the default of Config.MaxLogBytesTotal: 256 MiB, or
// where logs would live in memory, which counts against the sandbox's
// memory limit, an eighth of that limit (at least 4 MiB) if less.
func defaultLogBudget(dir string) int64 {
	const onDisk = 256 << 20
	if !process.SpoolsInMemory(dir) {
		return onDisk
	}
	g, err := cgroup.Open(cgroup.Config{})
	if err != nil {
		return onDisk
	}
	st, err := g.Read()
	if err != nil || st.MemLimit == 0 {
		return onDisk
	}
	return min(onDisk, max(int64(st.MemLimit/8), 4<<20))
}
