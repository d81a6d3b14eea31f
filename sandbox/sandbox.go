// Package sandbox is the domain of the lifecycle server: what a sandbox
// is, its states, what it is made from, and the Runtime interface that
// makes sandboxes real on Docker or Kubernetes. It says what, never how;
// it imports only the standard library, and any package may import it.
package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"
)

// ID identifies a sandbox: a random UUID (version 4) with dashes.
type ID string

// NewID returns a fresh random ID.
func NewID() ID { return ID(newUUID()) }

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return strings.Join([]string{h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]}, "-")
}

// State is where a sandbox is in its life. The set is open: clients
// accept values they do not know.
type State string

// States of the lifecycle API.
const (
	StatePending    State = "Pending"
	StateRunning    State = "Running"
	StatePausing    State = "Pausing"
	StatePaused     State = "Paused"
	StateResuming   State = "Resuming"
	StateStopping   State = "Stopping"
	StateTerminated State = "Terminated"
	StateFailed     State = "Failed"
	StateUnknown    State = "Unknown"
)

// Status is a sandbox's state with why and since when.
type Status struct {
	State State
	// Reason is a short machine-readable code, such as CONTAINER_RUNNING
	// or IMAGE_PULL_FAILED.
	Reason string
	// Message is for people: on a failure, what to do about it.
	Message string
	// Since is when the state was entered.
	Since time.Time
}

// Sandbox is a sandbox as its runtime knows it.
type Sandbox struct {
	ID         ID
	Image      string // the image it was made from; empty when restored from a snapshot
	SnapshotID string // the snapshot it was restored from, if any
	Entrypoint []string
	Metadata   map[string]string
	Platform   *Platform
	// Extensions are the extensions the sandbox was created with.
	Extensions map[string]string
	// SecureAccess is set when every port requires the sandbox's token.
	SecureAccess bool
	Status       Status
	CreatedAt    time.Time
	// ExpiresAt is when the sandbox is deleted automatically; nil means
	// never.
	ExpiresAt *time.Time
}

// Expired reports whether s has an expiry at or before now.
func (s *Sandbox) Expired(now time.Time) bool {
	return s.ExpiresAt != nil && !s.ExpiresAt.After(now)
}

// Platform constrains the OS and CPU architecture a sandbox runs on.
type Platform struct {
	OS   string // "linux" or "windows"
	Arch string // "amd64" or "arm64"
}

// Endpoint says how a client reaches a port of a sandbox: a scheme-less
// "host:port[/path]" address, and headers to send with every request.
type Endpoint struct {
	Address string
	Headers map[string]string
}

// Well-known ports inside every sandbox, besides execd's (api.ExecdPort).
const (
	PortEgress = 18080 // the egress policy API
	PortApp    = 8080  // the conventional application port
)

// HeaderExecdToken carries a sandbox's execd token.
const HeaderExecdToken = "X-EXECD-ACCESS-TOKEN"
