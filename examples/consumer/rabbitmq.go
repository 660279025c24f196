package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitSource consumes a durable queue with manual acks.
type rabbitSource struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	tag  string
	out  chan delivery
	once sync.Once
}

// openRabbitMQ connects, declares the durable queue cfg.queue (the default
// exchange routes to it by name) and starts consuming with manual acks and a
// prefetch of twice the workers.
func openRabbitMQ(_ context.Context, cfg config) (*rabbitSource, error) {
	conn, err := amqp.Dial(cfg.amqpURL)
	if err != nil {
		return nil, fmt.Errorf("AMQP_URL: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(cfg.queue, true, false, false, false, nil)
	}
	if err == nil {
		err = ch.Qos(2*cfg.workers, 0, false)
	}
	s := &rabbitSource{conn: conn, ch: ch, tag: "idemkey-consumer-" + rand.Text(), out: make(chan delivery)}
	var in <-chan amqp.Delivery
	if err == nil {
		in, err = ch.Consume(cfg.queue, s.tag, false, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("queue %s: %w", cfg.queue, err)
	}
	go func() {
		defer close(s.out)
		for d := range in { // closed after Cancel (or a lost connection)
			s.out <- rabbitDelivery{d}
		}
	}()
	return s, nil
}

func (s *rabbitSource) Deliveries() <-chan delivery { return s.out }

// Stop cancels the subscription; the deliveries the server had already sent
// still come out of Deliveries, which is closed after them.
func (s *rabbitSource) Stop() {
	s.once.Do(func() { _ = s.ch.Cancel(s.tag, false) })
}

func (s *rabbitSource) Close() error {
	s.Stop()
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
