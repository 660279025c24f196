package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/internal/proctest"
)

// Each test publishes 1,000 instructions twice each (2,000 messages, every
// broker id different) and checks that the table ends with exactly one row per
// instruction, on both brokers.
const (
	numInstructions = 1000
	drainLimit      = time.Minute
)

var brokers = []struct {
	name string
	open func(t testing.TB) testBroker
}{
	{"nats", func(t testing.TB) testBroker { return newNATS(t) }},
	{"rabbitmq", func(t testing.TB) testBroker { return newRabbit(t) }},
}

type fixture struct {
	broker testBroker
	tables *tables
	bin    string
	name   string
	want   []instruction
	msgs   []message
}

func setup(t *testing.T, open func(testing.TB) testBroker, name string) *fixture {
	t.Helper()
	f := &fixture{broker: open(t), tables: newTables(t), bin: proctest.Build(t, ".", "consumer"), name: name}
	f.want, f.msgs = instructions(numInstructions)
	return f
}

func (f *fixture) start(t *testing.T, env ...string) *proctest.Proc {
	t.Helper()
	return proctest.StartReady(t, f.bin, "consuming "+f.name, append(append(f.broker.env(), f.tables.env()...), env...)...)
}

// finish waits until every instruction has its row and the broker has nothing
// left to deliver, stops the consumers (SIGINT: in-flight messages commit and
// ack), checks that nothing came back to the broker, and checks the rows.
func (f *fixture) finish(t *testing.T, procs ...*proctest.Proc) {
	t.Helper()
	waitUntil(t, drainLimit, "every instruction applied and every message acked", func() bool {
		return f.tables.rows(t) >= numInstructions && f.broker.idle(t)
	})
	for _, p := range procs {
		if !p.Killed() {
			p.Stop()
		}
	}
	if !f.broker.idle(t) {
		t.Fatal("messages returned to the broker after the consumers stopped: some were never acked")
	}
	f.tables.check(t, f.want)
}

// TestDuplicatesAndFailures: every instruction arrives twice, and the handler
// fails (after its write, which rolls back) on the first delivery of 5% of them:
// the failed ones are redelivered and applied once, the duplicates never.
func TestDuplicatesAndFailures(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			f := setup(t, b.open, b.name)
			f.broker.publish(t, f.msgs)
			p := f.start(t, "CONSUMER_FAULT_FAIL_FIRST_PERCENT=5")
			f.finish(t, p)
		})
	}
}

// TestKilledBetweenCommitAndAck: the consumer is SIGKILLed after 300 commits
// whose acks it holds back; the restarted one gets those messages again and
// acks them without applying them twice.
func TestKilledBetweenCommitAndAck(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			f := setup(t, b.open, b.name)
			f.broker.publish(t, f.msgs)
			first := f.start(t, "CONSUMER_FAULT_STALL_AFTER_COMMITS=300")
			waitUntil(t, drainLimit, "300 commits", func() bool { return f.tables.rows(t) >= 300 })
			if n := f.broker.unacked(t); n == 0 {
				t.Fatal("no message delivered and unacked at the kill")
			}
			first.Kill()
			if n := f.tables.rows(t); n < 300 || n >= numInstructions {
				t.Fatalf("%d rows at the kill, want 300 or more, fewer than %d", n, numInstructions)
			}
			second := f.start(t)
			f.finish(t, second)
		})
	}
}

// TestTwoConsumers: two processes share the durable consumer (NATS) or the
// queue (RabbitMQ), with failures on 5% of first deliveries.
func TestTwoConsumers(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			f := setup(t, b.open, b.name)
			one := f.start(t, "CONSUMER_FAULT_FAIL_FIRST_PERCENT=5")
			two := f.start(t, "CONSUMER_FAULT_FAIL_FIRST_PERCENT=5")
			f.broker.publish(t, f.msgs)
			f.finish(t, one, two)
		})
	}
}

// TestMalformedRejected: a body that is not an instruction, or whose header
// names another instruction, is rejected for good (never redelivered, no row),
// and the valid message next to it is applied.
func TestMalformedRejected(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			f := setup(t, b.open, b.name)
			good := f.want[0]
			f.want = f.want[:1]
			other := good
			other.InstructionID = good.InstructionID + "-other"
			// Poison ahead of the valid message: what the account API refuses
			// too (zero or negative amounts, a member in another letter case or
			// repeated) is rejected, never applied, and does not hold up the queue.
			id := `"instructionId":"` + good.InstructionID + `"`
			msgs := []message{
				{instruction: good, brokerID: "bad-json-" + uniqueName(), raw: []byte("{not json")},
				{instruction: good, brokerID: "no-amount-" + uniqueName(), raw: []byte(`{` + id + `,"accountId":"a"}`)},
				{instruction: good, brokerID: "header-differs-" + uniqueName(), raw: mustJSON(t, other)},
			}
			for _, poison := range []string{
				`{` + id + `,"accountId":"a","amountCents":0}`,
				`{` + id + `,"accountId":"a","amountCents":-100}`,
				`{` + id + `,"accountId":"a","amountCents":2147483648}`,
				`{` + id + `,"accountId":"a","AmountCents":100}`,
				`{` + id + `,"accountId":"a","amountCents":100,"AMOUNTCENTS":-100}`,
				`{` + id + `,"accountId":"a","amountCents":100,"amountCents":-100}`,
				`{` + id + `,"accountId":"a","accountId":"b","amountCents":100}`,
			} {
				for range 5 {
					msgs = append(msgs, message{instruction: good, brokerID: "poison-" + uniqueName(), raw: []byte(poison)})
				}
			}
			f.broker.publish(t, append(msgs, message{instruction: good, brokerID: "good-" + uniqueName()}))
			p := f.start(t)
			waitUntil(t, drainLimit, "the valid message applied and the others settled", func() bool {
				return f.tables.rows(t) >= 1 && f.broker.idle(t)
			})
			p.Stop()
			if !f.broker.idle(t) {
				t.Fatal("a malformed message came back to the broker")
			}
			f.tables.check(t, f.want)
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConfig(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{"DATABASE_URL": "postgres://x"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	c, err := loadConfig(env())
	if err != nil {
		t.Fatal(err)
	}
	if c.broker != "nats" || c.natsURL != "nats://127.0.0.1:4222" || c.amqpURL != "amqp://guest:guest@127.0.0.1:5672/" ||
		c.stream != "PAYMENTS" || c.subjectPrefix != "" || c.queue != "payments.instructions" || c.tablePrefix != "" ||
		c.ackWait != 30*time.Second || c.workers != 8 || c.withoutInbox {
		t.Fatalf("defaults: %+v", c)
	}
	for _, bad := range [][]string{
		{"CONSUMER_BROKER", "kafka"},
		{"DATABASE_URL", ""},
		{"CONSUMER_WORKERS", "0"},
		{"CONSUMER_FAULT_FAIL_FIRST_PERCENT", "101"},
		{"CONSUMER_FAULT_STALL_AFTER_COMMITS", "-1"},
		{"CONSUMER_ACK_WAIT", "10ms"},
	} {
		if _, err := loadConfig(env(bad...)); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%s=%q: %v, want an error naming it", bad[0], bad[1], err)
		}
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name, body, key string
		ok              bool
	}{
		{"valid", `{"instructionId":"i1","accountId":"a1","amountCents":500}`, "i1", true},
		{"no header", `{"instructionId":"i1","accountId":"a1","amountCents":500}`, "", true},
		{"header differs", `{"instructionId":"i1","accountId":"a1","amountCents":500}`, "i2", false},
		{"not JSON", `nope`, "i1", false},
		{"trailing data", `{"instructionId":"i1","accountId":"a1","amountCents":5} {}`, "i1", false},
		{"fractional amount", `{"instructionId":"i1","accountId":"a1","amountCents":5.5}`, "i1", false},
		{"amount missing", `{"instructionId":"i1","accountId":"a1"}`, "i1", false},
		{"id missing", `{"accountId":"a1","amountCents":5}`, "", false},
		{"NUL in id", `{"instructionId":"i\u00001","accountId":"a1","amountCents":5}`, "", false},
		{"id too long", `{"instructionId":"` + strings.Repeat("x", maxIDLen+1) + `","accountId":"a1","amountCents":5}`, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decode([]byte(tc.body), tc.key)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, errMalformed)) {
				t.Fatalf("decode: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestFailFirstPicksThePercentage: the fault picks about the configured share
// of instructions, the same ones in every process.
func TestFailFirstPicksThePercentage(t *testing.T) {
	a := &applier{cfg: config{failFirstPercent: 5}}
	ins, _ := instructions(numInstructions)
	n := 0
	for _, in := range ins {
		if a.failFirst(in.InstructionID) {
			n++
		}
		if a.failFirst(in.InstructionID) != (&applier{cfg: config{failFirstPercent: 5}}).failFirst(in.InstructionID) {
			t.Fatal("failFirst differs between two appliers")
		}
	}
	if n < 20 || n > 90 {
		t.Fatalf("%d of %d instructions picked, want about 5%%", n, numInstructions)
	}
	if (&applier{}).failFirst(ins[0].InstructionID) {
		t.Fatal("failFirst picked an instruction at 0%")
	}
}
