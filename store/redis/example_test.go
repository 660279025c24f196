package redis_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// Example puts the store behind the middleware. The client enables
// ContextTimeoutEnabled: without it the store's deadlines (the middleware's
// store timeouts) do not bound socket reads, and a hung server holds requests
// past the 503 bound. The server needs maxmemory-policy noeviction; one prefix
// per application. It needs a server (REDIS_URL), so it is compiled but not run
// by go test.
func Example() {
	ctx := context.Background()
	opt, err := goredis.ParseURL(os.Getenv("REDIS_URL")) // e.g. redis://127.0.0.1:6379/0
	if err != nil {
		log.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true
	client := goredis.NewClient(opt)
	defer client.Close()

	st, err := redis.New(client, redis.WithPrefix("payments:idem:"))
	if err != nil {
		log.Fatal(err) // a nil client, a prefix with a brace
	}
	if err := st.CheckEvictionPolicy(ctx); err != nil {
		log.Fatal(err) // records must not be evicted
	}
	defer st.StopWaiters() // after the last request

	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated) // runs once per key; retries get this answer
		fmt.Fprintln(w, `{"id":42}`)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", m.Handler(mux)))
}

// On Redis Cluster every record is one key with a hash tag, so each script runs on
// the node owning the key's slot.
func ExampleNew_cluster() {
	client := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		ContextTimeoutEnabled: true, // the store's deadlines bound socket reads
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
