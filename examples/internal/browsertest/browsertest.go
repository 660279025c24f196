// Package browsertest starts headless Chromium for the examples' browser tests,
// through chromedp (the Chrome DevTools Protocol), with Debian's chromium package.
package browsertest

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkey/idemkey/internal/testenv"
)

// Binary returns the path of the Chromium binary. Without one the test fails under
// CI=true (a missing tool is a failure there, never a skip) and is skipped otherwise.
func Binary(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "chromium is not installed (apt-get install chromium)")
	return ""
}

// New starts a headless Chromium (no sandbox, no GPU, no background networking) and
// returns a chromedp context on a fresh tab, bounded by timeout. The browser is
// closed at the test's cleanup.
func New(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Binary(t)), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	t.Cleanup(func() {
		cancel()
		cancelBrowser()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}
