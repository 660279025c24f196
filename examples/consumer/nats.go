package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsSource is a durable JetStream pull consumer.
type natsSource struct {
	nc   *nats.Conn
	it   jetstream.MessagesContext
	out  chan delivery
	once sync.Once
	done chan struct{}
}

// natsReconnectWait is the wait between two attempts to reconnect to NATS.
const natsReconnectWait = time.Second

// openNATS connects, creates the stream (cfg.stream on <prefix>payments.>)
// unless it exists, creates or updates the durable pull consumer of
// <prefix>payments.instructions, and starts pulling. A lost connection is
// retried forever (the pull resumes on reconnection); the outage is logged
// once when it begins and once when it ends.
func openNATS(ctx context.Context, cfg config, logger *slog.Logger) (*natsSource, error) {
	nc, err := nats.Connect(cfg.natsURL, nats.Name("idemkey-consumer"), nats.MaxReconnects(-1),
		nats.ReconnectWait(natsReconnectWait),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil && !nc.IsClosed() && !nc.IsDraining() { // not our own Close or Drain
				logger.Warn("lost the NATS connection; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Info("NATS connection restored; consuming again", "server", nc.ConnectedUrlRedacted())
		}))
	if err != nil {
		return nil, fmt.Errorf("NATS_URL=%q: %w", cfg.natsURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if _, err := js.Stream(ctx, cfg.stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:     cfg.stream,
			Subjects: []string{cfg.subjectPrefix + "payments.>"},
			Storage:  jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // another consumer created it meanwhile
		}
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("create stream %s: %w", cfg.stream, err)
		}
	} else if err != nil {
		nc.Close()
		return nil, fmt.Errorf("stream %s: %w", cfg.stream, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.stream, jetstream.ConsumerConfig{
		Durable:       cfg.durable,
		FilterSubject: cfg.subjectPrefix + "payments.instructions",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.ackWait,
		MaxDeliver:    -1,
	})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("durable consumer %s: %w", cfg.durable, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * cfg.workers))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("pull from %s: %w", cfg.durable, err)
	}
	s := &natsSource{nc: nc, it: it, out: make(chan delivery), done: make(chan struct{})}
	go s.pump()
	return s, nil
}

func (s *natsSource) pump() {
	defer close(s.out)
	for {
		m, err := s.it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			// A missed heartbeat or a reconnect: the iterator carries on.
			select {
			case <-s.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case s.out <- natsDelivery{m}:
		case <-s.done:
			return // fetched, never handed out: redelivered after the ack wait
		}
	}
}

func (s *natsSource) Deliveries() <-chan delivery { return s.out }

func (s *natsSource) Stop() {
	s.once.Do(func() {
		close(s.done)
		s.it.Stop()
	})
}

func (s *natsSource) Close() error {
	s.Stop()
	for range s.out { // wait for the pump
	}
	return s.nc.Drain()
}

type natsDelivery struct{ m jetstream.Msg }

func (d natsDelivery) Body() []byte { return d.m.Data() }
func (d natsDelivery) Key() string  { return d.m.Headers().Get("Idempotency-Key") }
func (d natsDelivery) First() bool {
	md, err := d.m.Metadata()
	return err == nil && md.NumDelivered == 1
}
func (d natsDelivery) Ack() error    { return d.m.Ack() }
func (d natsDelivery) Nack() error   { return d.m.Nak() }
func (d natsDelivery) Reject() error { return d.m.Term() }
