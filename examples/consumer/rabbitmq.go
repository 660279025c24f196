package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Back-off between two attempts to reconnect to RabbitMQ: it starts at
// rabbitRetryMin and doubles up to rabbitRetryMax, each wait jittered to
// between half and all of it.
const (
	rabbitRetryMin = 200 * time.Millisecond
	rabbitRetryMax = 10 * time.Second
)

// rabbitSource consumes a durable queue with manual acks. When the connection
// is lost (a broker restart, a network cut) it reconnects with back-off and
// consumes again; the deliveries it had not acked go back to the queue and are
// redelivered (the inbox answers those it had already applied).
type rabbitSource struct {
	cfg    config
	logger *slog.Logger
	tag    string
	out    chan delivery
	stop   chan struct{}

	mu      sync.Mutex // guards conn, ch and stopped
	conn    *amqp.Connection
	ch      *amqp.Channel
	stopped bool
}

var errStopped = errors.New("stopped")

// openRabbitMQ connects, declares the durable queue cfg.queue (the default
// exchange routes to it by name) and starts consuming with manual acks and a
// prefetch of twice the workers. A first connection that fails is an error;
// a later loss is retried until Stop.
func openRabbitMQ(_ context.Context, cfg config, logger *slog.Logger) (*rabbitSource, error) {
	s := &rabbitSource{cfg: cfg, logger: logger, tag: "idemkey-consumer-" + rand.Text(),
		out: make(chan delivery), stop: make(chan struct{})}
	in, err := s.connect()
	if err != nil {
		return nil, err
	}
	go s.pump(in)
	return s, nil
}

// connect opens a connection and a channel and starts consuming on it.
func (s *rabbitSource) connect() (<-chan amqp.Delivery, error) {
	conn, err := amqp.Dial(s.cfg.amqpURL)
	if err != nil {
		return nil, fmt.Errorf("AMQP_URL: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(s.cfg.queue, true, false, false, false, nil)
	}
	if err == nil {
		err = ch.Qos(2*s.cfg.workers, 0, false)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.stopped {
		err = errStopped
	}
	var in <-chan amqp.Delivery
	if err == nil {
		in, err = ch.Consume(s.cfg.queue, s.tag, false, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("queue %s: %w", s.cfg.queue, err)
	}
	if s.conn != nil {
		_ = s.conn.Close() // the lost one
	}
	s.conn, s.ch = conn, ch
	return in, nil
}

// pump hands the deliveries out, reconnecting whenever the connection's
// delivery channel closes before Stop; it closes out once stopped.
func (s *rabbitSource) pump(in <-chan amqp.Delivery) {
	defer close(s.out)
	for {
		for d := range in { // closed after Cancel, or when the connection is lost
			s.out <- rabbitDelivery{d}
		}
		if s.isStopped() {
			return
		}
		s.logger.Warn("lost the RabbitMQ connection; reconnecting", "queue", s.cfg.queue)
		in = s.reconnect()
		if in == nil {
			return
		}
	}
}

// reconnect connects again, with back-off, until it succeeds (logged) or Stop
// is called (nil).
func (s *rabbitSource) reconnect() <-chan amqp.Delivery {
	wait, attempts := rabbitRetryMin, 0
	for {
		t := time.NewTimer(wait/2 + mathrand.N(wait/2+1))
		select {
		case <-s.stop:
			t.Stop()
			return nil
		case <-t.C:
		}
		attempts++
		in, err := s.connect()
		if err == nil {
			s.logger.Info("RabbitMQ connection restored; consuming again", "queue", s.cfg.queue, "attempts", attempts)
			return in
		}
		if errors.Is(err, errStopped) {
			return nil
		}
		wait = min(2*wait, rabbitRetryMax)
	}
}

func (s *rabbitSource) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

func (s *rabbitSource) Deliveries() <-chan delivery { return s.out }

// Stop cancels the subscription and any reconnection; the deliveries the server
// had already sent still come out of Deliveries, which is closed after them.
func (s *rabbitSource) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	close(s.stop)
	_ = s.ch.Cancel(s.tag, false) // fails on a lost connection, whose deliveries are closed anyway
}

func (s *rabbitSource) Close() error {
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn.Close()
}

type rabbitDelivery struct{ d amqp.Delivery }

func (d rabbitDelivery) Body() []byte {
	return d.d.Body
}

func (d rabbitDelivery) Key() string {
	switch k := d.d.Headers["Idempotency-Key"].(type) {
	case string:
		return k
	case []byte:
		return string(k)
	}
	return ""
}

func (d rabbitDelivery) First() bool   { return !d.d.Redelivered }
func (d rabbitDelivery) Ack() error    { return d.d.Ack(false) }
func (d rabbitDelivery) Nack() error   { return d.d.Nack(false, true) }
func (d rabbitDelivery) Reject() error { return d.d.Reject(false) }
