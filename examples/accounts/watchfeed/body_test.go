package watchfeed_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts/watchfeed"
)

// TestStreamRequestBodyIsBounded: a stream request whose headers declare a
// body (a Content-Length, or chunked) that never arrives is not held open: it
// is answered 400 and the connection closed at once, without waiting for the
// body (Connection: close), so not by the server's ReadTimeout. A body sent
// whole is refused 400 too (the stream takes none). A request without a body
// still streams past the same timeout (TestStreamOutlivesServerTimeouts).
func TestStreamRequestBodyIsBounded(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	defer sim.Close()
	f, _ := startFeed(t, sim, watchfeed.Options{Heartbeat: 20 * time.Millisecond})
	srv := httptest.NewUnstartedServer(f)
	// Far past the client's 10 s bound below, so the answer must not wait for
	// it: the test waits on the answer and the close, never on a timer a busy
	// machine could miss (a 100 ms ReadTimeout here once expired before the
	// server had read the request: "unexpected EOF").
	srv.Config.ReadTimeout = time.Minute
	srv.Start()
	t.Cleanup(srv.Close)
	for name, req := range map[string]string{
		"declared, never sent": "Content-Length: 10\r\n\r\n",
		"declared, half sent":  "Content-Length: 10\r\n\r\nabcde",
		"chunked, never ended": "Transfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n",
		"sent whole":           "Content-Length: 5\r\n\r\nabcde",
		"chunked, sent whole":  "Transfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n%s", req)
			// Held open, the stream would send a heartbeat every 20 ms forever.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("status %d, then the connection stayed open: %v (read %q)", resp.StatusCode, err, trim(body))
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d %q, want 400", resp.StatusCode, trim(body))
			}
		})
	}
}

func trim(b []byte) string {
	s := string(b)
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strings.ReplaceAll(s, "\n", `\n`)
}
