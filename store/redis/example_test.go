package redis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// A Redis server with maxmemory-policy noeviction; one prefix per application.
// Claim, run the handler once, Complete; a retry gets the stored response.
func Example() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	s, err := redis.New(client, redis.WithPrefix("payments:idem:"))
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	req := store.ClaimRequest{
		ID:          store.ID{Scope: "tenant-7", Key: "9f1c2a"},
		Fingerprint: store.Fingerprint{ /* SHA-256 of the request */ },
		Lease:       10 * time.Second,
		Retention:   24 * time.Hour,
	}
	res, err := s.Claim(ctx, req)
	if err != nil {
		log.Fatal(err) // the middleware answers 503
	}
	switch res.Outcome {
	case store.Claimed:
		// Run the handler, then keep its response for the retention.
		resp := store.Response{Status: 201, Body: []byte(`{"id":42}`)}
		if err := s.Complete(ctx, req.ID, res.Token, resp, req.Retention); err != nil {
			log.Print(err) // store.ErrLeaseLost: another holder took over
		}
	case store.Completed:
		fmt.Printf("replay %d %s\n", res.Record.Status, res.Record.Body)
	case store.InFlight:
		fmt.Println("409, retry after", res.RetryAfter)
	case store.Mismatch:
		fmt.Println("422, key reused for another request")
	}
}

// On Redis Cluster every record is one key with a hash tag, so each script runs on
// the node owning the key's slot.
func ExampleNew_cluster() {
	client := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
	})
	defer client.Close()
	s, err := redis.New(client)
	if err != nil {
		log.Fatal(err) // a nil client
	}
	_ = s // use as a store.Store
}

// The documented key layout: prefix, then the hash tag holding the scope's length,
// the scope and the key.
func ExampleStore_Key() {
	s, err := redis.New(goredis.NewClient(&goredis.Options{}), redis.WithPrefix("idem:"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Key(store.ID{Scope: "tenant", Key: "order-42"}))
	fmt.Println(s.Key(store.ID{Scope: "", Key: "6:tenantorder-42"}))
	// Output:
	// idem:{6:tenantorder-42}
	// idem:{0:6:tenantorder-42}
}
