package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A fault is what an X-Fault request header asks for when PAYMENTS_FAULTS=1:
//
//	X-Fault: crash-after-commit   SIGKILL right after the transaction commits,
//	                              before the response is written
//	X-Fault: crash-before-commit  SIGKILL right before the commit
//	X-Fault: slow=<duration>      sleep inside the transaction (Go duration, at most 1m)
//
// The header is not part of the request's fingerprint, so a retry without it is
// the same request.
type fault struct {
	crashAfterCommit, crashBeforeCommit bool
	slow                                time.Duration
}

const maxSlow = time.Minute

func parseFault(v string) (fault, error) {
	v = strings.TrimSpace(v)
	switch {
	case v == "crash-after-commit":
		return fault{crashAfterCommit: true}, nil
	case v == "crash-before-commit":
		return fault{crashBeforeCommit: true}, nil
	case strings.HasPrefix(v, "slow="):
		d, err := time.ParseDuration(strings.TrimPrefix(v, "slow="))
		if err != nil || d <= 0 || d > maxSlow {
			return fault{}, fmt.Errorf("X-Fault %q: want slow=<duration>, a positive Go duration of at most %v", v, maxSlow)
		}
		return fault{slow: d}, nil
	}
	return fault{}, fmt.Errorf("X-Fault %q: want crash-after-commit, crash-before-commit or slow=<duration>", v)
}

type faultKey struct{}

func faultFrom(ctx context.Context) fault {
	f, _ := ctx.Value(faultKey{}).(fault)
	return f
}

// withFaults reads the X-Fault header into the request context; an unknown value
// is a 400 problem before the idempotency middleware, so it claims no key.
func withFaults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Values("X-Fault")
		if len(v) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		f, err := parseFault(strings.Join(v, ","))
		if err != nil {
			writeProblem(w, http.StatusBadRequest, codeBadFault, err.Error(), 0)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), faultKey{}, f)))
	})
}

// crash kills the process with SIGKILL: no deferred call, no graceful shutdown,
// no answer to any client.
func crash() {
	p, err := os.FindProcess(os.Getpid())
	if err == nil {
		err = p.Kill()
	}
	if err != nil {
		panic(fmt.Sprintf("X-Fault: cannot SIGKILL the process: %v", err))
	}
	select {} // the signal is on its way
}

// faultTx crashes before the commit (crash-before-commit).
type faultTx struct {
	pgx.Tx
	f fault
}

func (t faultTx) Commit(ctx context.Context) error {
	if t.f.crashBeforeCommit {
		crash()
	}
	return t.Tx.Commit(ctx)
}

// faultWriter crashes when the response starts, after the commit
// (crash-after-commit).
type faultWriter struct {
	http.ResponseWriter
	f fault
}

func (w faultWriter) WriteHeader(code int) {
	if w.f.crashAfterCommit {
		crash()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w faultWriter) Write(p []byte) (int, error) {
	if w.f.crashAfterCommit {
		crash()
	}
	return w.ResponseWriter.Write(p)
}

func (w faultWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
