// Package idemprom feeds Prometheus (client_golang) from the idempotency
// middleware and the stores. It is its own module,
// github.com/idemkey/idemkey/observer/prometheus, so the core never requires
// client_golang; it imports only the core (middleware, store, store/tiered).
//
// Two pieces, registered on a registry of the application's own:
//
//   - Observer is a middleware.Observer (middleware.WithObserver): per-request
//     decision counters, the store latency histogram and the counters derived from
//     them. It costs no allocation per request.
//   - Collector reads the stores' own counters when Prometheus scrapes: a tiered
//     store's Stats (answers, misses, fall-throughs to the backstop, backfills,
//     outages, degraded) and the Postgres store's claim retries.
//
// Series of the Observer (every counter starts at 0 for every label value it can
// take, so dashboards see them before the first event):
//
//	idemkey_decisions_total{decision}          every request, by middleware.Decision name;
//	                                           "store_full" counts the 503s of a store at
//	                                           its bound (store.ErrFull), apart from
//	                                           "store_error" (a store that cannot answer)
//	idemkey_store_latency_seconds{decision}    histogram: store time on the request's path
//	                                           (claim, then complete or release), for
//	                                           requests that reached the store
//	idemkey_replays_total                      completed records replayed
//	idemkey_in_flight_total                    409 request_in_flight answers
//	idemkey_mismatches_total                   422 key_reused_with_different_payload
//	idemkey_store_errors_total                 store failures: 503 store_unavailable,
//	                                           fail-open runs, failed completions or
//	                                           releases (a lost lease or a full store is
//	                                           not one)
//	idemkey_takeovers_total                    claims that took over an expired lease
//	idemkey_completions_pending_total          responses sent before the store held them:
//	                                           the one attempt failed and completion goes
//	                                           on in the background (Event.CompletionPending)
//	idemkey_in_transaction_completions_total   responses the handler stored in its own
//	                                           transaction (Event.InTransaction)
//	idemkey_wait_seconds                       histogram (DefaultWaitBuckets, 1 ms to 30 s): how long a duplicate waited for
//	                                           the holder of its key (WithWaitInFlight;
//	                                           Event.Waited), for requests that waited
//	idemkey_handler_answers_total{status}      answers the protected handler itself gave
//	                                           (executed, released, lease lost or fail
//	                                           open), by HTTP status
//
// Series of the Collector (only those of the stores it was given):
//
//	idemkey_tiered_fast_answers_total          claims Redis answered alone
//	idemkey_tiered_fast_misses_total           claims Redis could not decide (backstop asked)
//	idemkey_tiered_fall_through_total{reason}  fast-path calls that fell through to the
//	                                           backstop alone: reason "error" (Redis failed
//	                                           or timed out), "skipped" (cooling down after
//	                                           an error)
//	idemkey_tiered_backfills_total             backstop replays copied into Redis
//	idemkey_tiered_outages_total               times the fast path went down
//	idemkey_tiered_degraded                    gauge: 1 while the fast path is down
//	idemkey_postgres_claim_retries_total       claim statements re-run after the READ
//	                                           COMMITTED hazard (docs/architecture.md
//	                                           section 4)
//
// The decision table behind the labels is docs/architecture.md section 3.
package idemprom
