package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

func TestManagerExpiresSandboxes(t *testing.T) {
	rt := fake.New()
	m := NewManager(rt, ManagerConfig{ExpiryInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	soon := time.Now().Add(200 * time.Millisecond)
	short, _ := m.Create(ctx, sandbox.Spec{Image: "img", Entrypoint: []string{"x"}, ExpiresAt: &soon})
	forever, _ := m.Create(ctx, sandbox.Spec{Image: "img", Entrypoint: []string{"x"}})
	deadline := time.Now().Add(time.Second)
	for {
		if _, err := rt.Get(ctx, short.ID); errors.Is(err, sandbox.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("expired sandbox still there one second after its expiry")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := rt.Get(ctx, forever.ID); err != nil {
		t.Fatalf("sandbox without expiry: %v", err)
	}
}

func TestManagerRenew(t *testing.T) {
	rt := fake.New()
	m := NewManager(rt, ManagerConfig{MaxTimeout: time.Hour})
	ctx := context.Background()
	exp := time.Now().Add(time.Minute)
	withTTL, _ := m.Create(ctx, sandbox.Spec{Image: "img", Entrypoint: []string{"x"}, ExpiresAt: &exp})
	noTTL, _ := m.Create(ctx, sandbox.Spec{Image: "img", Entrypoint: []string{"x"}})

	at := time.Now().Add(30 * time.Minute)
	got, err := m.Renew(ctx, withTTL.ID, at)
	if err != nil || !got.Equal(at.UTC()) {
		t.Fatalf("Renew = %v, %v", got, err)
	}
	var ce *sandbox.CodedError
	if _, err := m.Renew(ctx, noTTL.ID, at); !errors.Is(err, sandbox.ErrConflict) || !errors.As(err, &ce) {
		t.Fatalf("renew without expiry: %v, want a coded conflict", err)
	}
	if _, err := m.Renew(ctx, withTTL.ID, time.Now().Add(-time.Second)); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("renew into the past: %v", err)
	}
	if _, err := m.Renew(ctx, withTTL.ID, time.Now().Add(2*time.Hour)); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("renew beyond the maximum: %v", err)
	}
	if _, err := m.Renew(ctx, sandbox.NewID(), at); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("renew of an unknown sandbox: %v", err)
	}
}
