package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/internal/accountsapp/apptest"
	"github.com/idemkey/idemkey/examples/internal/browsertest"
)

// pageCard is an account card as the page shows it.
type pageCard struct {
	Name, ID, Toast, ToastKind string
	Balance, Version           int64
	History                    []string
}

// pageWrite is one line of the page's write log.
type pageWrite struct {
	Op, Status, Notes, Text string
	Message                 string // the status line the write showed on its card
	Balance, Version        int64
	Replayed                bool
}

// TestPageInBrowser drives the page of package webui (GET /) in headless Chromium
// against two nethttp servers sharing one simulator over TCP, the page on replica
// 1. It asserts, as a user would see it:
//
//   - the three seeded accounts are listed with their seed balances;
//   - a deposit, a withdrawal and a transfer each show in the write log with status
//     200 and the new balance and version, and the cards and histories follow;
//   - an overdraft shows the business message of the error body (its message
//     member) as a warning, not "Server error.";
//   - with Watch on, a deposit made through replica 2 appears on the page (the
//     card's balance and history) with no action on the page: only the watch stream
//     can bring it;
//   - "Deposit twice" while the simulator is slow: the copy, sent with the same key
//     while the first runs, ends with the original's answer (200, the same balance
//     and version, marked replayed, its status line labelled a replay), and the
//     account holds one deposit.
func TestPageInBrowser(t *testing.T) {
	ctx := browsertest.New(t, 2*time.Minute)
	sim := celeriantsim.New(celeriantsim.Options{})
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	r1 := apptest.Start(t, wire, map[string]string{"CELERIANT_ADDR": ln.Addr().String()})
	r2 := apptest.Start(t, wire, map[string]string{"CELERIANT_ADDR": ln.Addr().String()})

	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	poll := func(what, cond string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingInterval(20*time.Millisecond),
			chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("waiting for %s (%s): %v", what, cond, err)
		}
	}
	cards := func() map[string]pageCard {
		t.Helper()
		list, err := chromedp.Run(ctx, chromedp.Evaluate[[]pageCard](`Array.from(document.querySelectorAll("section.account")).map(c => ({
			Name: c.dataset.name, ID: c.dataset.accountId, Balance: +c.dataset.balance, Version: +c.dataset.version,
			Toast: c.querySelector(".toast").textContent, ToastKind: c.querySelector(".toast").dataset.kind || "",
			History: Array.from(c.querySelectorAll(".history li")).map(li => li.textContent) }))`))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]pageCard{}
		for _, c := range list {
			out[c.Name] = c
		}
		return out
	}
	writes := func(n int) []pageWrite {
		t.Helper()
		poll(strconv.Itoa(n)+" writes in the log", `document.querySelectorAll("#log li[data-done]").length >= `+strconv.Itoa(n))
		list, err := chromedp.Run(ctx, chromedp.Evaluate[[]pageWrite](`Array.from(document.querySelectorAll("#log li")).map(li => ({
			Op: li.dataset.op, Status: li.dataset.status || "", Notes: li.dataset.notes || "", Text: li.textContent, Message: li.dataset.message || "",
			Balance: +(li.dataset.balance || 0), Version: +(li.dataset.version || 0), Replayed: li.dataset.replayed === "1" }))`))
		if err != nil {
			t.Fatal(err)
		}
		return list
	}
	// fill types into a card's fields and clicks one of its buttons in one step of
	// the page's event loop: a re-render (a watch event) cannot come in between.
	fill := func(name, action string, fields map[string]string) {
		t.Helper()
		js := `(() => { const c = document.querySelector('section[data-name="` + name + `"]');`
		for sel, v := range fields {
			js += ` c.querySelector('` + sel + `').value = ` + strconv.Quote(v) + `;`
		}
		js += ` c.querySelector('[data-action="` + action + `"]').click(); return true; })()`
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js)); err != nil {
			t.Fatalf("%s on %s: %v", action, name, err)
		}
	}
	act := func(name, action, amount string) {
		t.Helper()
		fill(name, action, map[string]string{".amount": amount})
	}

	run("opening the page", chromedp.Navigate(r1.URL+"/"))
	poll("the accounts", `document.body.dataset.ready === "1"`)
	c := cards()
	for name, cents := range map[string]int64{"Alice": 50000, "Bob": 25000, "Charlie": 10000} {
		if c[name].Balance != cents || c[name].Version != 1 || len(c[name].History) != 1 {
			t.Fatalf("card %s: %+v, want the seed %d at version 1 with one history line", name, c[name], cents)
		}
	}
	if len(c) != 3 || c["Alice"].ID != accounts.AliceID.String() {
		t.Fatalf("cards %+v, want Alice, Bob and Charlie", c)
	}

	// Each write shows, with its answer, and the cards follow.
	act("Alice", "deposit", "25.00")
	w := writes(1)
	act("Bob", "withdraw", "10.00")
	w = writes(2)
	fill("Alice", "transfer", map[string]string{".transfer-amount": "5.00", ".transfer-target": accounts.CharlieID.String()})
	w = writes(3)
	for i, want := range []pageWrite{{Op: "Deposit", Status: "200", Balance: 52500, Version: 2},
		{Op: "Withdrawal", Status: "200", Balance: 24000, Version: 2}, {Op: "Transfer", Status: "200", Balance: 52000, Version: 3}} {
		got := w[i]
		if got.Op != want.Op || got.Status != want.Status || got.Balance != want.Balance || got.Version != want.Version || got.Replayed {
			t.Fatalf("write %d on the page: %+v, want %+v", i, got, want)
		}
	}
	poll("the transfer on both cards", `document.querySelector('section[data-name="Charlie"]').dataset.balance === "10500"`)
	c = cards()
	if c["Alice"].Balance != 52000 || c["Bob"].Balance != 24000 || !strings.HasPrefix(c["Alice"].History[0], "Transfer to Charlie -$5.00") ||
		!strings.HasPrefix(c["Charlie"].History[0], "Transfer from Alice $5.00") {
		t.Fatalf("cards after the writes: %+v", c)
	}

	// An overdraft shows the business message.
	act("Charlie", "withdraw", "1000.00")
	if w = writes(4); w[3].Status != "422" {
		t.Fatalf("overdraft: %+v, want 422", w[3])
	}
	if c = cards(); c["Charlie"].Toast != "Cannot process $1000.00, balance is $105.00" || c["Charlie"].ToastKind != "warn" {
		t.Fatalf("overdraft on the page: %q (%s), want the business message as a warning", c["Charlie"].Toast, c["Charlie"].ToastKind)
	}

	// A deposit through the other replica appears through the watch stream.
	run("Watch", chromedp.Click(`#watch`))
	poll("the watch stream", `document.body.dataset.watching === "1"`)
	if dep := apptest.Do(t, "POST", r2.URL+"/api/accounts/"+accounts.BobID.String()+"/deposit", `"browser-r2"`, "", `{"amountCents":1234}`); dep.Status != 200 {
		t.Fatalf("deposit on replica 2: %d %s", dep.Status, dep.Body)
	}
	poll("replica 2's deposit on the page", `document.querySelector('section[data-name="Bob"]').dataset.balance === "25234"`)
	if c = cards(); !strings.HasPrefix(c["Bob"].History[0], "Deposit $12.34 v3") {
		t.Fatalf("Bob's history after replica 2's deposit: %q", c["Bob"].History)
	}

	// A retry racing the original ends with the original's answer.
	sim.SetDelay(400 * time.Millisecond) // a deposit makes several calls: over a second in all
	act("Alice", "deposit-twice", "7.00")
	w = writes(6)
	sim.SetDelay(0)
	first, copy := w[4], w[5]
	if first.Op != "Deposit" || copy.Op != "Deposit (copy)" {
		first, copy = copy, first
	}
	if first.Status != "200" || copy.Status != "200" || first.Balance != 52700 || copy.Balance != first.Balance ||
		copy.Version != first.Version || first.Replayed || !copy.Replayed {
		t.Fatalf("deposit twice: original %+v, copy %+v; want both 200 with the original's balance and version, the copy replayed", first, copy)
	}
	// The copy's status line says it is a replay, never "Deposit (copy) successful."
	// (which reads as a second deposit); the original's says it succeeded.
	if first.Message != "Deposit successful." || !strings.HasPrefix(copy.Message, "Deposit replayed:") || strings.Contains(copy.Message, "successful") {
		t.Fatalf("deposit twice: the original says %q, the copy %q; want \"Deposit successful.\" and a replay label", first.Message, copy.Message)
	}
	t.Logf("the copy: %s (%q)", copy.Text, copy.Message)
	hist := apptest.Do(t, "GET", r1.URL+"/api/accounts/"+accounts.AliceID.String()+"/history", "", "", "")
	var h struct {
		Events []struct {
			Type        string
			AmountCents int
		}
	}
	if err := json.Unmarshal([]byte(hist.Body), &h); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range h.Events {
		if e.Type == "Deposited" && e.AmountCents == 700 {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d deposits of 7.00 in Alice's history, want 1", n)
	}
}
