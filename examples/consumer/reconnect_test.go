package main

import (
	"context"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// logRecorder keeps the messages of every log record; changed is signalled
// after each.
type logRecorder struct {
	mu      sync.Mutex
	msgs    []string
	changed chan struct{}
}

func newLogRecorder() *logRecorder { return &logRecorder{changed: make(chan struct{}, 1)} }

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
	return nil
}

// count returns how many records so far have a message starting with prefix.
func (l *logRecorder) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// wait blocks until a record's message starts with prefix (a minute at most),
// failing the test if done (consume's end) comes first.
func (l *logRecorder) wait(t *testing.T, prefix string, done <-chan error) {
	t.Helper()
	timeout := time.After(time.Minute)
	for l.count(prefix) == 0 {
		select {
		case <-l.changed:
		case err := <-done:
			t.Fatalf("consume returned, waiting for log %q: %v", prefix, err)
		case <-timeout:
			t.Fatalf("no log %q within a minute; logged %q", prefix, l.msgs)
		}
	}
}

// viaProxy returns the broker's URL (the variable name, which newRabbit or
// newNATS required) with its host replaced by a proxy's, and the proxy.
func viaProxy(t *testing.T, name string) (string, *proxy) {
	t.Helper()
	u, err := url.Parse(os.Getenv(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.addr()
	return u.String(), p
}

// outageCase runs the consumer in this process, through a proxy to the broker
// it cuts and restores: messages published before, during and after the
// outage are all applied once, and consume keeps running through it.
func outageCase(t *testing.T, b testBroker, brokerURL string, p *proxy, lost, restored string) *logRecorder {
	tb := newTables(t)
	env := map[string]string{}
	for _, kv := range append(append(b.env(), tb.env()...), brokerURL, "CONSUMER_WORKERS=2") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &readyWriter{ch: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- consume(ctx, cfg, out, slog.New(logs)) }()
	select {
	case <-out.ch:
	case err := <-done:
		t.Fatalf("consume: %v", err)
	}
	want, msgs := instructions(30)
	var once []message
	for i := 0; i < len(msgs); i += 2 {
		once = append(once, msgs[i]) // the shuffled copies: every instruction at least once
	}
	applied := func(n int) func() bool {
		return func() bool { return tb.rows(t) >= n && b.idle(t) }
	}
	first := map[string]bool{}
	for _, m := range once[:len(once)/3] {
		first[m.instruction.InstructionID] = true
	}
	b.publish(t, once[:len(once)/3])
	waitUntil(t, drainLimit, "the first third applied", applied(len(first)))

	p.cut()
	logs.wait(t, lost, done)
	p.waitRefused(t, 3) // it keeps trying, and the outage is still one log line
	b.publish(t, once[len(once)/3:2*len(once)/3])
	select {
	case err := <-done:
		t.Fatalf("consume returned during the outage: %v", err)
	default:
	}
	p.restore()
	logs.wait(t, restored, done)
	b.publish(t, once[2*len(once)/3:])
	b.publish(t, msgs) // and every instruction once more: duplicates
	waitUntil(t, drainLimit, "every instruction applied", applied(len(want)))
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consume after the outage: %v", err)
	}
	tb.check(t, want)
	if n := logs.count(lost); n != 1 {
		t.Errorf("the outage was logged %d times (%q), want once", n, lost)
	}
	return logs
}

// TestRabbitMQReconnects: the connection to RabbitMQ is lost (every
// connection cut, new ones refused, as in a broker restart) and comes back:
// the consumer logs the loss, reconnects with back-off, and consumes again.
func TestRabbitMQReconnects(t *testing.T) {
	b := newRabbit(t)
	u, p := viaProxy(t, "AMQP_URL")
	outageCase(t, b, "AMQP_URL="+u, p, "lost the RabbitMQ connection", "RabbitMQ connection restored")
}

// TestNATSOutageLogged: NATS goes away and comes back: the consumer logs the
// outage once (not once per reconnection attempt) and its end, and consumes
// again.
func TestNATSOutageLogged(t *testing.T) {
	b := newNATS(t)
	u, p := viaProxy(t, "NATS_URL")
	outageCase(t, b, "NATS_URL="+u, p, "lost the NATS connection", "NATS connection restored")
}
