package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkey/idemkey/examples/internal/browsertest"
)

// pageResult is one payment attempt as the page shows it.
type pageResult struct {
	Done, Status, PaymentID, Text string
}

// TestCheckoutPageInBrowser drives the checkout page (GET /) in headless
// Chromium against the payments process and the fake gateway (processes), with
// the gateway losing the first answer for every key after charging. In each case
// the page must show the same payment twice, having retried the lost answer
// (a 503) with the same key, and the gateway and the table must hold one more
// charge and one more row:
//
//   - Pay clicked twice quickly: two requests of one checkout, one after the other;
//   - after New checkout, the Pay twice control: two identical requests at once.
func TestCheckoutPageInBrowser(t *testing.T) {
	ctx := browsertest.New(t, 90*time.Second)
	// A short lease: the copy that meets the in-flight first request waits
	// Retry-After, at most the rest of the lease.
	s := startStack(t, 1, []string{"GATEWAY_LOSE_FIRST=1"}, []string{"IDEM_LEASE=2s"})

	if err := chromedp.Do(ctx, chromedp.Navigate(s.payments[0].URL+"/"), chromedp.WaitVisible(chromedp.ID("pay"))); err != nil {
		t.Fatalf("opening the page: %v", err)
	}

	results := func(want int) []pageResult {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](
			`document.querySelectorAll("#results li[data-done]").length >= `+strconv.Itoa(want), chromedp.WithPollingInterval(50*time.Millisecond)))
		var out []pageResult
		if err == nil {
			out, err = chromedp.Run(ctx, chromedp.Evaluate[[]pageResult](`Array.from(document.querySelectorAll("#results li")).map(li => ({
				Done: li.dataset.done || "", Status: li.dataset.status || "", PaymentID: li.dataset.paymentId || "", Text: li.textContent }))`))
		}
		if err != nil {
			t.Fatalf("waiting for %d results on the page: %v", want, err)
		}
		if len(out) != want {
			t.Fatalf("%d results on the page, want %d: %+v", len(out), want, out)
		}
		return out
	}

	var ids []string
	for i, tc := range []struct {
		name    string
		actions []chromedp.Action[chromedp.Void]
	}{
		{"Pay clicked twice", []chromedp.Action[chromedp.Void]{chromedp.Click(chromedp.ID("pay")), chromedp.Click(chromedp.ID("pay"))}},
		{"Pay twice control", []chromedp.Action[chromedp.Void]{chromedp.Click(chromedp.ID("new-checkout")), chromedp.Click(chromedp.ID("pay-twice"))}},
	} {
		if err := chromedp.Do(ctx, tc.actions...); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := results(2 * (i + 1))[2*i:]
		a, b := got[0], got[1]
		if a.Status != "201" || b.Status != "201" || a.PaymentID == "" || a.PaymentID != b.PaymentID ||
			!strings.Contains(a.Text, a.PaymentID) || !strings.Contains(b.Text, b.PaymentID) {
			t.Fatalf("%s: the page shows %+v and %+v; want one payment, shown twice", tc.name, a, b)
		}
		if !strings.Contains(a.Text+b.Text, "503, retrying") {
			t.Fatalf("%s: no retry after the lost answer on the page: %q / %q", tc.name, a.Text, b.Text)
		}
		t.Logf("%s: the page shows %q and %q", tc.name, a.Text, b.Text)
		for _, id := range ids {
			if id == a.PaymentID {
				t.Fatalf("%s: payment %s repeats an earlier checkout's", tc.name, id)
			}
		}
		ids = append(ids, a.PaymentID)
		charges := s.charges(t)
		if len(charges) != i+1 || s.ts.rows(t) != i+1 {
			t.Fatalf("%s: %d charges and %d rows, want %d of each", tc.name, len(charges), s.ts.rows(t), i+1)
		}
		if strings.Count(a.Text, charges[i].ID) != 1 {
			t.Fatalf("%s: the page does not show charge %s: %q", tc.name, charges[i].ID, a.Text)
		}
	}
}
