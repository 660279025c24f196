package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
)

// serverURL returns the environment variable name, the address of a server the
// test needs (what); without it the test fails under CI=true and is skipped
// otherwise, naming the variable.
func serverURL(t testing.TB, name, what string) string {
	t.Helper()
	return testenv.Getenv(t, name, what)
}

// need runs check, the connection to the server at the variable name: one that
// does not answer fails the test with CI=true and skips it otherwise.
func need(t testing.TB, name string, check func() error) {
	t.Helper()
	if err := check(); err != nil {
		testenv.Missing(t, "%s=%s unreachable: %v", name, os.Getenv(name), err)
	}
}

func databaseURL(t testing.TB) string {
	t.Helper()
	return serverURL(t, "DATABASE_URL", "a Postgres server")
}

// testBroker is one broker under test with names of its own (stream, durable
// consumer or queue), deleted at the end; nothing the test did not create is
// touched.
type testBroker interface {
	// env is the consumer process's environment for these names.
	env() []string
	// publish sends each message; it returns once the broker stored them all.
	publish(t testing.TB, msgs []message)
	// idle reports whether every published message was delivered and acked.
	idle(t testing.TB) bool
	// unacked reports how many messages are delivered and not acked, when the
	// broker tells (-1 otherwise).
	unacked(t testing.TB) int
}

// message is one publish: an instruction and the broker's own message id.
type message struct {
	instruction instruction
	brokerID    string
	raw         []byte // the body instead of the instruction's JSON, when set
}

func (m message) body() []byte {
	if m.raw != nil {
		return m.raw
	}
	b, _ := json.Marshal(m.instruction)
	return b
}

// uniqueName is a fresh lowercase suffix for a test's names.
func uniqueName() string { return store.NewToken().String()[:12] }

// --- NATS JetStream ---

type natsBroker struct {
	js                      jetstream.JetStream
	stream, prefix, durable string
}

func newNATS(t testing.TB) *natsBroker {
	t.Helper()
	url := serverURL(t, "NATS_URL", "a NATS server with JetStream")
	var nc *nats.Conn
	need(t, "NATS_URL", func() (err error) { nc, err = nats.Connect(url); return err })
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := uniqueName()
	b := &natsBroker{js: js, stream: "IDEMKEY_TEST_" + strings.ToUpper(id), prefix: "idemkey_test_" + id + ".", durable: "applier-" + id}
	// The test creates the stream (the consumer finds it) so messages published
	// before a consumer runs are kept, and deletes it at the end.
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: b.stream, Subjects: []string{b.prefix + "payments.>"}, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), b.stream); err != nil {
			t.Errorf("delete test stream %s: %v", b.stream, err)
		}
	})
	return b
}

func (b *natsBroker) env() []string {
	return []string{"CONSUMER_BROKER=nats", "CONSUMER_NATS_STREAM=" + b.stream,
		"CONSUMER_NATS_SUBJECT_PREFIX=" + b.prefix, "CONSUMER_NATS_DURABLE=" + b.durable, "CONSUMER_ACK_WAIT=2s"}
}

func (b *natsBroker) publish(t testing.TB, msgs []message) {
	t.Helper()
	for _, m := range msgs {
		msg := &nats.Msg{Subject: b.prefix + "payments.instructions", Data: m.body(), Header: nats.Header{}}
		msg.Header.Set("Idempotency-Key", m.instruction.InstructionID)
		msg.Header.Set(jetstream.MsgIDHeader, m.brokerID)
		if _, err := b.js.PublishMsgAsync(msg); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publish acks did not arrive within 30s")
	}
	info, err := b.js.Stream(t.Context(), b.stream)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got < uint64(len(msgs)) {
		t.Fatalf("stream holds %d messages, want at least %d (broker ids must all differ)", got, len(msgs))
	}
}

func (b *natsBroker) info(t testing.TB) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := b.js.Consumer(t.Context(), b.stream, b.durable)
	if err != nil {
		t.Fatalf("consumer %s: %v", b.durable, err)
	}
	return c.CachedInfo()
}

func (b *natsBroker) idle(t testing.TB) bool {
	i := b.info(t)
	return i.NumPending == 0 && i.NumAckPending == 0
}

func (b *natsBroker) unacked(t testing.TB) int { return b.info(t).NumAckPending }

// --- RabbitMQ ---

type rabbitBroker struct {
	ch    *amqp.Channel
	queue string
}

func newRabbit(t testing.TB) *rabbitBroker {
	t.Helper()
	url := serverURL(t, "AMQP_URL", "a RabbitMQ server")
	var conn *amqp.Connection
	need(t, "AMQP_URL", func() (err error) { conn, err = amqp.Dial(url); return err })
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b := &rabbitBroker{ch: ch, queue: "idemkey_test." + uniqueName() + ".instructions"}
	if _, err := ch.QueueDeclare(b.queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(b.queue, false, false, false); err != nil {
			t.Errorf("delete test queue %s: %v", b.queue, err)
		}
	})
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *rabbitBroker) env() []string {
	return []string{"CONSUMER_BROKER=rabbitmq", "CONSUMER_AMQP_QUEUE=" + b.queue}
}

func (b *rabbitBroker) publish(t testing.TB, msgs []message) {
	t.Helper()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		c, err := b.ch.PublishWithDeferredConfirmWithContext(t.Context(), "", b.queue, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: m.brokerID,
			Headers: amqp.Table{"Idempotency-Key": m.instruction.InstructionID}, Body: m.body(),
		})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		confirms = append(confirms, c)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, c := range confirms {
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

func (b *rabbitBroker) queueState(t testing.TB) amqp.Queue {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(b.queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue: %v", err)
	}
	return q
}

// idle: nothing ready. Unacked deliveries are not counted by the broker's
// answer; the tests stop the consumers afterwards and check that nothing came back.
func (b *rabbitBroker) idle(t testing.TB) bool { return b.queueState(t).Messages == 0 }

func (b *rabbitBroker) unacked(testing.TB) int { return -1 }

// --- Postgres ---

type tables struct {
	pool   *pgxpool.Pool
	prefix string
}

func newTables(t testing.TB) *tables {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tb := &tables{pool: pool, prefix: "idemkey_test_" + uniqueName() + "_"}
	t.Cleanup(func() {
		defer pool.Close()
		for _, name := range []string{"applied_instructions", "consumer_inbox", "consumer_inbox_migrations"} {
			if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{tb.prefix + name}.Sanitize()); err != nil {
				t.Errorf("drop %s%s: %v", tb.prefix, name, err)
			}
		}
	})
	return tb
}

func (tb *tables) env() []string {
	return []string{"DATABASE_URL=" + os.Getenv("DATABASE_URL"), "CONSUMER_TABLE_PREFIX=" + tb.prefix}
}

// rows returns the number of applied rows, 0 before the table exists.
func (tb *tables) rows(t testing.TB) int {
	t.Helper()
	var n int
	err := tb.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{tb.prefix + "applied_instructions"}.Sanitize()).Scan(&n)
	if err != nil && !strings.Contains(err.Error(), "42P01") { // undefined_table: no consumer started yet
		t.Fatalf("count rows: %v", err)
	}
	return n
}

// check fails unless the table holds exactly one row per instruction, with its
// account and amount.
func (tb *tables) check(t testing.TB, want []instruction) {
	t.Helper()
	rows, err := tb.pool.Query(t.Context(), "SELECT instruction_id, account_id, amount_cents FROM "+pgx.Identifier{tb.prefix + "applied_instructions"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	byID := map[string]instruction{}
	for _, in := range want {
		byID[in.InstructionID] = in
	}
	n := 0
	for rows.Next() {
		var id, account string
		var amount int64
		if err := rows.Scan(&id, &account, &amount); err != nil {
			t.Fatal(err)
		}
		n++
		got[id]++
		if w, ok := byID[id]; !ok || w.AccountID != account || *w.AmountCents != amount {
			t.Errorf("row %q/%q/%d matches no published instruction", id, account, amount)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	missing, doubled := 0, 0
	for _, in := range want {
		switch got[in.InstructionID] {
		case 0:
			missing++
		case 1:
		default:
			doubled++
		}
	}
	if n != len(want) || missing != 0 || doubled != 0 {
		t.Fatalf("%d rows for %d instructions: %d missing, %d applied more than once", n, len(want), missing, doubled)
	}
}

// instructions returns n instructions and their 2n messages, each instruction
// published twice under different broker ids, in a shuffled order.
func instructions(n int) ([]instruction, []message) {
	ins := make([]instruction, n)
	msgs := make([]message, 0, 2*n)
	run := uniqueName()
	for i := range ins {
		amount := int64(100 + i)
		ins[i] = instruction{InstructionID: fmt.Sprintf("instr-%s-%04d", run, i), AccountID: fmt.Sprintf("acc-%d", i%17), AmountCents: &amount}
		for copy := range 2 {
			msgs = append(msgs, message{instruction: ins[i], brokerID: fmt.Sprintf("%s-%d-%d-%s", run, i, copy, uniqueName())})
		}
	}
	r := rand.New(rand.NewPCG(uint64(n), 11))
	r.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return ins, msgs
}

// waitUntil polls cond (state of other processes and servers) every 20 ms, for
// at most limit.
func waitUntil(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond) // polling another process's progress
	}
}
