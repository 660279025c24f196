// Package natsenv is the JetStream setup the payments example's relay and
// receipts consumer share: one environment, one stream.
package natsenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is the NATS part of the environment.
type Config struct {
	// URL is NATS_URL, default nats://127.0.0.1:4222.
	URL string
	// Stream is PAYMENTS_NATS_STREAM, default PAYMENTS: the stream on
	// <SubjectPrefix>payments.>, created if missing (the consumer example's
	// stream of the same name serves as well).
	Stream string
	// SubjectPrefix is PAYMENTS_NATS_SUBJECT_PREFIX, default none: prefixes
	// every subject (tests use their own).
	SubjectPrefix string
	// DuplicateWindow is PAYMENTS_NATS_DUPLICATE_WINDOW, the stream's window
	// of Nats-Msg-Id deduplication when the stream is created here; default
	// JetStream's (2 minutes).
	DuplicateWindow time.Duration
}

var streamRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// FromEnv reads Config; the error names the variable.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{URL: getenv("NATS_URL"), Stream: getenv("PAYMENTS_NATS_STREAM"), SubjectPrefix: getenv("PAYMENTS_NATS_SUBJECT_PREFIX")}
	if c.URL == "" {
		c.URL = "nats://127.0.0.1:4222"
	}
	if c.Stream == "" {
		c.Stream = "PAYMENTS"
	}
	if !streamRE.MatchString(c.Stream) {
		return c, fmt.Errorf("PAYMENTS_NATS_STREAM=%q: want 1-64 letters, digits, _ and -", c.Stream)
	}
	if strings.ContainsAny(c.SubjectPrefix, " \t\r\n*>") {
		return c, fmt.Errorf("PAYMENTS_NATS_SUBJECT_PREFIX=%q: no blanks or wildcards", c.SubjectPrefix)
	}
	if v := getenv("PAYMENTS_NATS_DUPLICATE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("PAYMENTS_NATS_DUPLICATE_WINDOW=%q: want a positive Go duration", v)
		}
		c.DuplicateWindow = d
	}
	return c, nil
}

// Subject returns the subject of topic (an outbox topic such as payments.receipts).
func (c Config) Subject(topic string) string { return c.SubjectPrefix + topic }

// Open connects (reconnecting forever after a loss, logged) and creates the
// stream unless it exists.
func Open(ctx context.Context, c Config, name string, logger *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(c.URL, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil && !nc.IsClosed() && !nc.IsDraining() {
				logger.Warn("lost the NATS connection; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { logger.Info("NATS connection restored") }))
	if err != nil {
		return nil, nil, fmt.Errorf("NATS_URL=%q: %w", c.URL, err)
	}
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: c.Stream, Subjects: []string{c.Subject("payments.>")},
			Storage: jetstream.FileStorage, Duplicates: c.DuplicateWindow})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // it exists: used as it is
		}
	}
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("stream %s: %w", c.Stream, err)
	}
	return nc, js, nil
}
