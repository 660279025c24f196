package accountsapp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/store"
)

// TestReadyz: every check ok is ready; a degraded store (store.ErrDegraded) is
// ready but says so, and is not logged at every probe; any failing check is a
// 503 that names it, with the cause logged, not shown.
func TestReadyz(t *testing.T) {
	ok := func(context.Context) error { return nil }
	degradedStore := func(context.Context) error {
		return fmt.Errorf("%w: tiered: redis fast path: dial tcp 10.0.0.7:6379: refused", store.ErrDegraded)
	}
	down := func(context.Context) error { return errors.New("dial tcp 10.0.0.8:5432: refused") }
	for _, tc := range []struct {
		name   string
		checks []check
		status int
		body   string
		logged bool
	}{
		{"all ok", []check{{"store", ok}, {"celeriant", ok}}, 200,
			`{"status":"ready","checks":{"celeriant":"ok","store":"ok"}}`, false},
		{"store degraded", []check{{"store", degradedStore}, {"celeriant", ok}}, 200,
			`{"status":"degraded","checks":{"celeriant":"ok","store":"degraded"}}`, false},
		{"degraded and down", []check{{"store", degradedStore}, {"celeriant", down}}, 503,
			`{"status":"unavailable","checks":{"celeriant":"unavailable","store":"degraded"}}`, true},
		{"down then degraded", []check{{"celeriant", down}, {"store", degradedStore}}, 503,
			`{"status":"unavailable","checks":{"celeriant":"unavailable","store":"degraded"}}`, true},
		{"store down", []check{{"store", down}, {"celeriant", ok}}, 503,
			`{"status":"unavailable","checks":{"celeriant":"ok","store":"unavailable"}}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			a := &App{checks: tc.checks, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			w := httptest.NewRecorder()
			a.Readyz(w, httptest.NewRequest("GET", "/readyz", nil))
			if w.Code != tc.status || strings.TrimSpace(w.Body.String()) != tc.body {
				t.Errorf("readyz: %d %s; want %d %s", w.Code, w.Body, tc.status, tc.body)
			}
			if strings.Contains(w.Body.String(), "10.0.0.") {
				t.Errorf("readyz shows a cause: %s", w.Body)
			}
			if got := logs.Len() > 0; got != tc.logged {
				t.Errorf("logged %v (%q), want %v", got, logs.String(), tc.logged)
			}
		})
	}
}
