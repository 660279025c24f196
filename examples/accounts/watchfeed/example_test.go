package watchfeed_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts/watchfeed"
)

// A feed over the simulator: a commit to a watched account becomes one SSE event.
func Example() {
	sim := celeriantsim.New(celeriantsim.Options{})
	defer sim.Close()
	org, typ := uuid.MustParse("00000000-0000-0000-0000-00000000000a"), uuid.MustParse("00000000-0000-0000-0000-00000000000b")
	acct := uuid.MustParse("6128e305-7e13-5ce6-ba25-6a4b44cc9f0e")
	feed, _ := watchfeed.New(sim, watchfeed.Options{Org: org, Type: typ, Accounts: []uuid.UUID{acct}})
	feed.Start(context.Background())
	defer feed.Close()
	<-feed.Ready()
	srv := httptest.NewServer(feed)
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for l, _ := r.ReadString('\n'); l != "\n"; l, _ = r.ReadString('\n') { // retry hint and ": connected"
	}
	_, _ = sim.Write(context.Background(), celeriant.WriteRequest{ClientID: uuid.New(), Writes: []celeriant.AggregateWrite{{
		Key: celeriant.AggregateKey{Org: org, Type: typ, ID: acct}, AllowCreate: true,
		Events: []celeriant.Event{{ClientSeq: 1, TypeMajor: 1, Value: []byte("{}")}},
	}}})
	line, _ := r.ReadString('\n')
	fmt.Println(resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"), resp.Header.Get("X-Accel-Buffering"))
	fmt.Print(strings.TrimSpace(line))
	// Output:
	// text/event-stream no-cache no
	// data: {"aggregateId":"6128e305-7e13-5ce6-ba25-6a4b44cc9f0e","operation":"Write","toAggregateVersion":1}
}
