package middleware

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// kept returns how long the memory store keeps key's completed record.
func (e *env) kept(t *testing.T, key string) time.Duration {
	t.Helper()
	info, err := e.mem.Inspect(context.Background(), store.ID{Scope: "anonymous", Key: key})
	if err != nil || info.State != store.StateCompleted {
		t.Fatalf("inspect %s: %+v %v", key, info, err)
	}
	return info.ExpiresAt.Sub(info.CompletedAt)
}

func TestSetRetention(t *testing.T) {
	var claimed []time.Duration
	handler := func(w http.ResponseWriter, r *http.Request) {
		d, _ := time.ParseDuration(r.Header.Get("X-Keep"))
		if err := claim.SetRetention(r.Context(), d); err != nil {
			t.Errorf("claim.SetRetention(%v): %v", d, err)
		}
		c, _ := claim.FromContext(r.Context())
		claimed = append(claimed, c.Retention)
		w.WriteHeader(http.StatusUnprocessableEntity)
	}
	e := newEnv(t, handler, WithRecordRetention(policy.RetentionRule{Max: 30 * 24 * time.Hour}))
	e.do(req("POST", "/p", "short", "x", "X-Keep", "10m"))
	e.do(req("POST", "/p", "long", "x", "X-Keep", "720h"))
	e.do(req("POST", "/p", "over", "x", "X-Keep", "9000h"))
	if got := []time.Duration{e.kept(t, "short"), e.kept(t, "long"), e.kept(t, "over")}; got[0] != 10*time.Minute ||
		got[1] != 720*time.Hour || got[2] != 720*time.Hour {
		t.Fatalf("kept %v, want 10m, 720h, 720h (clamped)", got)
	}
	if claimed[0] != 10*time.Minute || claimed[2] != 720*time.Hour {
		t.Errorf("claim.Claim.Retention %v", claimed)
	}
	// Past ten minutes the short record is gone: the key runs again.
	e.now.Add(11 * time.Minute)
	e.do(req("POST", "/p", "short", "x", "X-Keep", "10m"))
	e.do(req("POST", "/p", "long", "x", "X-Keep", "10m"))
	if e.calls.Load() != 4 {
		t.Fatalf("%d calls, want 4 (the short record expired, the long one replayed)", e.calls.Load())
	}
}

func TestSetRetentionDefaultMaximumIsTheRetention(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if err := claim.SetRetention(r.Context(), 30*24*time.Hour); err != nil {
			t.Error(err)
		}
	}, WithRecordRetention(policy.RetentionRule{Default: 2 * time.Hour}))
	e.do(req("POST", "/p", "k", "x"))
	if got := e.kept(t, "k"); got != 2*time.Hour {
		t.Fatalf("kept %v, want the retention (2h): the default maximum", got)
	}
}

func TestSetRetentionRefused(t *testing.T) {
	if err := claim.SetRetention(context.Background(), time.Hour); !errors.Is(err, claim.ErrNoClaim) {
		t.Errorf("no claim: %v", err)
	}
	var late context.Context
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if err := claim.SetRetention(r.Context(), 0); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("zero retention: %v", err)
		}
		late = r.Context()
	})
	e.do(req("POST", "/p", "k", "x"))
	if err := claim.SetRetention(late, time.Hour); !errors.Is(err, claim.ErrNoClaim) {
		t.Errorf("after the handler returned: %v", err)
	}
	if got := e.kept(t, "k"); got != claim.DefaultRetention {
		t.Errorf("kept %v", got)
	}
}
