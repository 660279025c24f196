package celeriant_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// allCodes lists every code of docs/celeriant-protocol.md section 5 with its class sentinel (nil: none)
// and a server message carrying its JSON detail.
var allCodes = []struct {
	code  celeriant.Code
	class error
	msg   string
}{
	{1000, celeriant.ErrUnavailableVersion, `{"requested":1,"minimum_available":6}`},
	{1001, celeriant.ErrNotFound, ``},
	{1002, nil, `{}`}, {1003, nil, `{"detail":"scan"}`}, {1004, nil, `{}`}, {1005, nil, `{}`},
	{2000, nil, `{}`}, {2001, nil, `{"client_seq":3}`},
	{2002, celeriant.ErrIdempotencyViolation, `{"last_client_seq":7,"attempted_client_seq":7}`},
	{2003, celeriant.ErrConflict, `{"expected_version":4,"current_aggregate_version":5}`},
	{2004, nil, `{"detail":"x"}`},
	{2005, celeriant.ErrNotFound, `{}`}, {2006, nil, `{}`}, {2007, nil, `{"detail":RollbackInProgress}`},
	{2008, nil, `{}`}, {2009, nil, `{a}`}, {2010, nil, `{}`},
	{2011, celeriant.ErrNotLeader, `{}`},
	{2012, celeriant.ErrBusy, `{}`},
	{2013, celeriant.ErrInflightDuplicate, `{"last_client_seq":9,"attempted_client_seq":8}`},
	{2020, nil, `{}`}, {2021, nil, `{}`}, {2022, nil, `{"detail":"bad"}`}, {2023, nil, `{}`}, {2024, nil, `{}`},
	{2025, nil, `{}`}, {2026, nil, `{}`}, {2027, nil, `{}`}, {2028, nil, `{}`}, {2029, nil, `{}`},
	{3000, celeriant.ErrNotFound, `{}`}, {3001, nil, `{}`}, {3002, nil, `{}`}, {3003, nil, `{}`},
	{3004, nil, `{"requested":9,"max_aggregate_version":3}`},
	{3005, celeriant.ErrNotLeader, `{"leader_address":"LEADER"}`}, {3006, celeriant.ErrBusy, `{}`},
	{4000, nil, `{}`}, {4001, nil, `{}`}, {4002, nil, `{}`}, {4003, nil, `{}`}, {4004, nil, `{}`}, {4005, nil, `{}`},
	{4006, celeriant.ErrNotLeader, `{}`}, {4007, celeriant.ErrBusy, `{}`},
	{5000, nil, `{}`}, {5001, nil, `{}`}, {5002, nil, `{}`},
	{6000, nil, `{}`}, {6001, nil, `{}`}, {6002, nil, `{}`},
	{7000, nil, `{}`}, {7001, celeriant.ErrNotFound, `{}`}, {7002, nil, `{}`},
	{8000, nil, `{}`}, {8001, nil, `{}`}, {8002, nil, `{}`}, {8003, nil, `{}`}, {8004, nil, `{}`}, {8005, nil, `{}`},
	{9000, nil, `{}`}, {9001, nil, `{"num_shards":2}`}, {9002, nil, `{"detail":"empty","num_shards":2}`},
	{10001, nil, `{}`}, {10002, nil, `{}`}, {10003, nil, `{}`}, {10004, nil, `{}`},
	{10005, nil, `{}`}, {10006, nil, `{}`}, {10007, nil, `{}`},
	{11000, celeriant.ErrBusy, `{}`},
}

var classes = []error{celeriant.ErrConflict, celeriant.ErrIdempotencyViolation, celeriant.ErrInflightDuplicate,
	celeriant.ErrUnavailableVersion, celeriant.ErrNotFound, celeriant.ErrNotLeader, celeriant.ErrBusy}

// TestErrorCodesRoundTrip: every code injected in the simulator reaches the TCP client
// as a typed error equal to the one the simulator returns in-process.
func TestErrorCodesRoundTrip(t *testing.T) {
	ctx := context.Background()
	sim, addr := startSim(t, celeriantsim.Options{})
	local := celeriantsim.New(celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	req := celeriant.WriteRequest{ClientID: uuid.New(), Writes: []celeriant.AggregateWrite{{
		Key: freshKey(), Events: []celeriant.Event{ev(1, uuid.New(), "x")}, AllowCreate: true,
	}}}
	resent, elections := 0, 0
	for _, tt := range allCodes {
		// A not-leader answer re-routes the client: name the simulator itself.
		tt.msg = strings.ReplaceAll(tt.msg, "LEADER", addr)
		var err error
		election := false
		switch se := celeriant.NewServerError(tt.code, tt.msg); {
		case errors.Is(se, celeriant.ErrNotLeader) && se.LeaderAddress == "":
			// An election: the client tries again until the request's context ends, on a
			// simulator of its own that answers this way to every try. The context ends
			// as the third try is being sent (cutDial), not after a time the machine's
			// load decides: the error is that try's, not sent, wrapping the last answer.
			esim, eaddr := startSim(t, celeriantsim.Options{})
			for range 1000 {
				esim.InjectWriteError(tt.code, tt.msg)
			}
			cut, cancel := context.WithCancel(ctx)
			d := &cutDial{cancel: cancel, try: 3}
			_, err = newClient(t, celeriant.Config{Addrs: []string{eaddr}, Dial: d.Dial}).Write(cut, req)
			cancel()
			election, elections = true, elections+1
			if n := esim.Stats().Writes; n != 2 {
				t.Errorf("code %d: %d tries answered during an election, want 2", tt.code, n)
			}
			if !errors.Is(err, celeriant.ErrNotSent) || !errors.Is(err, context.Canceled) {
				t.Errorf("code %d: %v, want the cut try's error (not sent)", tt.code, err)
			}
		case celeriant.IsBusy(se):
			// The client re-sends these (they had no effect) three times more.
			for range 4 {
				sim.InjectWriteError(tt.code, tt.msg)
			}
			resent += 3
			_, err = c.Write(ctx, req)
		default:
			sim.InjectWriteError(tt.code, tt.msg)
			_, err = c.Write(ctx, req)
		}
		local.InjectWriteError(tt.code, tt.msg)
		_, lerr := local.Write(ctx, req)

		var se, lse *celeriant.ServerError
		if !errors.As(err, &se) || !errors.As(lerr, &lse) {
			t.Fatalf("code %d: tcp %v, in-process %v", tt.code, err, lerr)
		}
		if se.Code != tt.code || !errors.Is(err, tt.code) || celeriant.CodeOf(err) != tt.code {
			t.Errorf("code %d: got %v", tt.code, err)
		}
		if se.CorrelationID == uuid.Nil {
			t.Errorf("code %d: the client did not set and check a correlation id", tt.code)
		}
		tcp, inproc := *se, *lse
		tcp.CorrelationID, inproc.CorrelationID = uuid.Nil, uuid.Nil
		if tcp != inproc {
			t.Errorf("code %d: tcp %+v != in-process %+v", tt.code, tcp, inproc)
		}
		for _, cl := range classes {
			if errors.Is(err, cl) != (cl == tt.class) {
				t.Errorf("code %d: errors.Is(%v) = %v", tt.code, cl, errors.Is(err, cl))
			}
		}
		if errors.Is(err, celeriant.ErrOutcomeUnknown) || !election && errors.Is(err, celeriant.ErrNotSent) {
			t.Errorf("code %d: a server answer must not be a transport error: %v", tt.code, err)
		}
	}
	if got, want := sim.Stats().Writes, len(allCodes)-elections+resent; got != want {
		t.Fatalf("simulator saw %d writes, want %d (one per call, re-sent only after a busy answer)", got, want)
	}
}

// cutDial is a Config.Dial whose connections end the request's context (cancel) as
// the client sends its try-th request frame, and let that frame's write fail only
// once the client, told by the context, has cut the connection: that try is not
// sent, after exactly try-1 answers, however loaded the machine.
type cutDial struct {
	cancel context.CancelFunc
	try    int32
	frames atomic.Int32
}

func (d *cutDial) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: nc, d: d, cut: make(chan struct{})}, nil
}

type cutConn struct {
	net.Conn
	d    *cutDial
	cut  chan struct{} // closed once the client set a deadline in the past
	once sync.Once
}

func (c *cutConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	if !t.IsZero() && t.Before(time.Now()) {
		c.once.Do(func() { close(c.cut) })
	}
	return err
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.d.frames.Add(1) == c.d.try {
		c.d.cancel()
		<-c.cut
	}
	return c.Conn.Write(p)
}

func TestServerErrorDetail(t *testing.T) {
	tests := []struct {
		code celeriant.Code
		msg  string
		want celeriant.ServerError
	}{
		{2002, `{"last_client_seq":7,"attempted_client_seq":6}`, celeriant.ServerError{LastClientSeq: 7, AttemptedClientSeq: 6}},
		{2003, `{"expected_version":4,"current_aggregate_version":5}`, celeriant.ServerError{ExpectedVersion: 4, CurrentVersion: 5}},
		{1000, `{"requested":1,"minimum_available":6}`, celeriant.ServerError{Requested: 1, MinimumAvailable: 6}},
		{2011, `{"leader_address":"h:1"}`, celeriant.ServerError{LeaderAddress: "h:1"}},
		{2007, `{"detail":RollbackInProgress}`, celeriant.ServerError{}},
		{2009, `{a}`, celeriant.ServerError{}},
		{2009, ``, celeriant.ServerError{}},
	}
	for _, tt := range tests {
		got := *celeriant.NewServerError(tt.code, tt.msg)
		tt.want.Code, tt.want.Message = tt.code, tt.msg
		if got != tt.want {
			t.Errorf("%d %s: got %+v", tt.code, tt.msg, got)
		}
	}
	if min, ok := celeriant.IsUnavailableVersion(celeriant.NewServerError(1000, `{"requested":1,"minimum_available":6}`)); !ok || min != 6 {
		t.Errorf("IsUnavailableVersion = %d %v", min, ok)
	}
	if addr, ok := celeriant.IsNotLeader(celeriant.NewServerError(2011, `{"leader_address":"h:1"}`)); !ok || addr != "h:1" {
		t.Errorf("IsNotLeader = %q %v", addr, ok)
	}
	if _, ok := celeriant.IsNotLeader(celeriant.NewServerError(2003, `{}`)); ok {
		t.Error("IsNotLeader(2003)")
	}
}
