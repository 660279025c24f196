package redistest

import (
	"testing"
)

// TestStartRefusesATakenPort: when the port freePort chose is taken before
// redis-server binds it (here by another private server), starting fails
// instead of handing the test someone else's server.
func TestStartRefusesATakenPort(t *testing.T) {
	other := StartServer(t)
	s := &Server{Addr: other.Addr, dir: t.TempDir()}
	s.args = []string{"--port", other.Addr[len("127.0.0.1:"):], "--bind", "127.0.0.1", "--save", "", "--dir", s.dir}
	t.Cleanup(s.Stop)
	if err := s.tryStart(); err == nil {
		t.Fatalf("started on %s, which another server holds", s.Addr)
	}
}
