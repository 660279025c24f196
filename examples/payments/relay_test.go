package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkey/idemkey/examples/internal/proctest"
	"github.com/idemkey/idemkey/store"
)

// TestRelayKilledMidBatch: payments are made through the payments process
// (three of them rolled back: the process is SIGKILLed before their commit and
// the keys never retried), then the relay, a process, publishes the outbox to
// a JetStream stream of the test's own in batches of 50, stalls after 120
// publishes (in its third batch, uncommitted) and is SIGKILLed there; restarted,
// it publishes the rest, re-publishing the 20 messages the dead batch had sent.
// The receipts consumer, a process, must end with exactly one row per committed
// payment and none for a rolled-back one. Two JetStream duplicate windows: an
// hour, longer than the test (the stream drops every re-publish), and
// JetStream's minimum, 100 ms, waited out by the server's own judgement (the
// re-publishes reach the stream, and the consumer's inbox drops them).
func TestRelayKilledMidBatch(t *testing.T) {
	for _, tc := range []struct {
		name        string
		window      time.Duration
		streamDedup bool
	}{{"jetstream-dedup", time.Hour, true}, {"inbox-dedup", 100 * time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) { relayKilledMidBatch(t, tc.window, tc.streamDedup) })
	}
}

func relayKilledMidBatch(t *testing.T, window time.Duration, streamDedup bool) {
	const payments, batch, stallAfter, stalled = 300, 50, 120, 120 - 2*50
	nurl := serverURL(t, "NATS_URL", "a NATS JetStream server")
	s := startStack(t, 1, nil, []string{"PAYMENTS_FAULTS=1"})
	ctx := context.Background()

	// Rolled back: the process dies before the commit, the client never retries.
	for i := range 3 {
		if _, err := do(http.DefaultClient, http.MethodPost, s.payments[len(s.payments)-1].URL+"/payments", payBody,
			"Authorization", "Bearer demo", "Idempotency-Key", fmt.Sprintf(`"rolled-back-%d"`, i), "X-Fault", "crash-before-commit"); err == nil {
			t.Fatal("the crash-before-commit request was answered")
		}
		s.payments[len(s.payments)-1].Kill()
		s.start(t)
	}
	payConcurrently(t, s.payments[len(s.payments)-1].URL, payments, "receipt", nil)
	if t.Failed() {
		return
	}
	if n := s.ts.rows(t); n != payments {
		t.Fatalf("%d payments, want %d (the rolled-back ones absent)", n, payments)
	}

	suffix := strings.ToUpper(store.NewToken().String()[:10])
	subjectPrefix := "paytest" + suffix + "."
	env := []string{"DATABASE_URL=" + databaseURL(t), "NATS_URL=" + nurl, "PAYMENTS_TABLE_PREFIX=" + s.ts.prefix,
		"PAYMENTS_NATS_STREAM=PAYTEST_" + suffix, "PAYMENTS_NATS_SUBJECT_PREFIX=" + subjectPrefix,
		"PAYMENTS_NATS_DUPLICATE_WINDOW=" + window.String()}
	js := testStream(t, nurl, "PAYTEST_"+suffix)
	proctest.StartReady(t, proctest.Build(t, "./receipts", "receipts"), "consuming nats", env...)
	relayBin := proctest.Build(t, "./relay", "relay")
	relay := proctest.StartReady(t, relayBin, "relaying to nats",
		append(env, fmt.Sprintf("RELAY_BATCH=%d", batch), fmt.Sprintf("RELAY_FAULT_STALL_AFTER=%d", stallAfter))...)
	count := func(sql string) int {
		var n int
		if err := s.ts.pool.QueryRow(ctx, fmt.Sprintf(sql, s.ts.prefix)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "the stalled relay's receipts at the consumer", func() bool {
		return count(`SELECT count(*) FROM "%sreceipts"`) >= stallAfter
	})
	relay.Kill()
	if pending := count(`SELECT count(*) FROM "%soutbox"`); pending != payments-2*batch {
		t.Fatalf("%d messages in the outbox after the kill, want %d: two batches committed, the third (%d published) not",
			pending, payments-2*batch, stalled)
	}
	if !streamDedup {
		waitForgotten(t, s.ts, js, subjectPrefix, stalled)
	}
	proctest.StartReady(t, relayBin, "relaying to nats", env...)
	waitFor(t, "the outbox drained and every receipt consumed", func() bool {
		// The outbox first: once it is empty every message is in the stream, and
		// only then does a consumer with nothing pending or unacked mean every
		// receipt recorded (read the other way round, the relay's last publishes
		// could land between the two reads, unseen by the consumer yet).
		if count(`SELECT count(*) FROM "%soutbox"`) != 0 {
			return false
		}
		info, err := js.Consumer(ctx, "PAYTEST_"+suffix, "payment-receipts")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci.NumPending == 0 && ci.NumAckPending == 0
	})
	if n := count(`SELECT count(*) FROM "%sreceipts"`); n != payments {
		t.Fatalf("%d receipts at the consumer, want %d: one per committed payment", n, payments)
	}
	if n := count(`SELECT count(*) FROM "%[1]spayments" p WHERE (SELECT count(*) FROM "%[1]sreceipts" r WHERE r.payment_id = p.id::text) = 1`); n != payments {
		t.Fatalf("%d payments with exactly one receipt, want %d", n, payments)
	}
	st, err := js.Stream(ctx, "PAYTEST_"+suffix)
	if err != nil {
		t.Fatal(err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stream messages %d (re-published after the kill: %d), receipts %d", si.State.Msgs, si.State.Msgs-payments, payments)
	if streamDedup && si.State.Msgs != payments || !streamDedup && si.State.Msgs < payments+stalled {
		t.Fatalf("%d messages in the stream with a %v duplicate window, want %s %d", si.State.Msgs, window,
			map[bool]string{true: "exactly", false: "at least"}[streamDedup], map[bool]uint64{true: payments, false: payments + stalled}[streamDedup])
	}
}

// waitForgotten returns once the stream's duplicate window no longer holds the
// ids of the dead batch's stalled publishes, as judged by the server itself
// (its window is a span of its clock, forgotten by its timer: a sleep of one
// window on the test's side can end first on a busy machine). It re-publishes
// the last of them, as the relay does, until JetStream stores it instead of
// dropping it as a duplicate; the server forgets ids in the order it stored
// them, so the earlier ones are forgotten too. The copy it stores is one more
// duplicate for the consumer's inbox.
func waitForgotten(t *testing.T, ts *testServer, js jetstream.JetStream, subjectPrefix string, stalled int) {
	t.Helper()
	var id, topic string
	var payload []byte
	if err := ts.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT message_id, topic, payload FROM "%soutbox"
		ORDER BY seq OFFSET $1 LIMIT 1`, ts.prefix), stalled-1).Scan(&id, &topic, &payload); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream's duplicate window to forget the stalled publishes", func() bool {
		ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: subjectPrefix + topic, Data: payload,
			Header: nats.Header{jetstream.MsgIDHeader: {id}}})
		if err != nil {
			t.Fatal(err)
		}
		return !ack.Duplicate
	})
}

// testStream returns JetStream on url and deletes the stream name at cleanup
// (the processes create it).
func testStream(t *testing.T, url, name string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), name); err != nil {
			t.Errorf("deleting stream %s: %v", name, err)
		}
		nc.Close()
	})
	return js
}
