package testwait

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// setPace makes the package measure the paces given, in turn (the last
// one again once they run out), and puts the real measure back after t.
func setPace(t *testing.T, fl time.Duration, paces ...time.Duration) *int {
	t.Helper()
	oldMeasure, oldFloor := measure, floor
	mu.Lock()
	oldMeasured, oldPace, oldErr := measured, pace, paceErr
	measured = false
	mu.Unlock()
	t.Cleanup(func() {
		measure, floor = oldMeasure, oldFloor
		mu.Lock()
		measured, pace, paceErr = oldMeasured, oldPace, oldErr
		mu.Unlock()
	})
	calls := new(int)
	floor = fl
	measure = func() (time.Duration, error) {
		d := paces[min(*calls, len(paces)-1)]
		*calls++
		return d, nil
	}
	return calls
}

func TestDeadline(t *testing.T) {
	for _, c := range []struct {
		n    int
		pace time.Duration
		want time.Duration
	}{
		{1, 200 * time.Millisecond, Floor},
		{1, 3 * time.Second, 30 * time.Second},
		{0, 3 * time.Second, 30 * time.Second},
		{4, 3 * time.Second, 2 * time.Minute},
		{3, time.Millisecond, 3 * Floor},
	} {
		if got := deadlineFor(c.n, c.pace); got != c.want {
			t.Errorf("deadlineFor(%d, %v) = %v, want %v", c.n, c.pace, got, c.want)
		}
	}
}

// TestPaceMeasuredOnce: waits share the first measure.
func TestPaceMeasuredOnce(t *testing.T) {
	calls := setPace(t, 50*time.Millisecond, 2*time.Millisecond)
	for range 3 {
		Wait{What: "x"}.Until(t, func() bool { return true })
	}
	if got := Timeout(); got != 50*time.Millisecond || *calls != 1 {
		t.Fatalf("Timeout() = %v after %d measures, want 50ms after 1", got, *calls)
	}
}

// TestUntilExtendsWhenBusier: a wait that would run out at the first
// pace goes on when the machine has become slower meanwhile.
func TestUntilExtendsWhenBusier(t *testing.T) {
	calls := setPace(t, 50*time.Millisecond, time.Millisecond, 40*time.Millisecond)
	start := time.Now()
	err := Wait{What: "slow thing", Every: time.Millisecond}.poll(start, func() bool { return time.Since(start) > 200*time.Millisecond })
	if err != nil || *calls != 2 {
		t.Fatalf("poll: %v after %d measures; want success after 2 (the deadline grew from 50ms to 400ms)", err, *calls)
	}
}

// TestUntilGivesUp: when the new pace allows no more time the wait ends,
// once, and says what it waited for and at what paces.
func TestUntilGivesUp(t *testing.T) {
	calls := setPace(t, 50*time.Millisecond, time.Millisecond, 2*time.Millisecond)
	start := time.Now()
	err := Wait{What: "the impossible", Starts: 2, Every: time.Millisecond}.poll(start, func() bool { return false })
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "the impossible") || !strings.Contains(err.Error(), "1ms at first, 2ms at the end") {
		t.Fatalf("poll: %v", err)
	}
	if took < 100*time.Millisecond || took > 5*time.Second || *calls != 2 {
		t.Fatalf("gave up after %v and %d measures; want 2 starts × 50ms floor, 2 measures", took, *calls)
	}
}

// TestUnmeasured: without an engine the pace is Floor/Factor and a
// failed wait says why it was not measured.
func TestUnmeasured(t *testing.T) {
	setPace(t, 50*time.Millisecond)
	measure = func() (time.Duration, error) { return 0, errors.New("no engine") }
	if p := Pace(); p != 5*time.Millisecond {
		t.Fatalf("Pace() = %v, want floor/Factor", p)
	}
	err := Wait{What: "x", Every: time.Millisecond}.poll(time.Now(), func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "no engine") {
		t.Fatalf("poll: %v", err)
	}
}

// TestMeasureDocker measures a real cold start.
func TestMeasureDocker(t *testing.T) {
	testenv.MustHaveImage(t, Image)
	d, err := measureDocker()
	if err != nil || d <= 0 || d >= measureTimeout {
		t.Fatalf("measureDocker() = %v, %v", d, err)
	}
	t.Logf("a cold docker run of %s took %v", Image, d)
	if out := Containers("label=opensandbox.testwait=none"); !strings.Contains(out, "no container") {
		t.Fatalf("Containers with no match: %q", out)
	}
}
