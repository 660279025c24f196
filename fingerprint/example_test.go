package fingerprint_test

import (
	"fmt"

	"github.com/idemkey/idemkey/fingerprint"
)

// Two deliveries of the same payment, with query parameters and JSON members in
// another order, have one fingerprint once canonical JSON is on; a changed
// amount does not.
func Example() {
	opts := fingerprint.Options{CanonicalJSON: true}
	a, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/payments", RawQuery: "currency=EUR&dry=0",
		Body: []byte(`{"amountCents": 500, "to": "acc-2"}`)}, opts)
	b, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/payments", RawQuery: "dry=0&currency=EUR",
		Body: []byte(`{"to":"acc-2","amountCents":500}`)}, opts)
	c, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/payments", RawQuery: "dry=0&currency=EUR",
		Body: []byte(`{"to":"acc-2","amountCents":501}`)}, opts)
	fmt.Println(a == b, a == c)

	canon, _ := fingerprint.AppendCanonicalJSON(nil, []byte(`{ "b": [2, 1], "a": 1.50 }`))
	fmt.Println(string(canon))
	fmt.Println(string(fingerprint.AppendCanonicalQuery(nil, "b=2&a=1&b=1")))
	// Output:
	// true false
	// {"a":1.50,"b":[2,1]}
	// a=1&b=2&b=1
}
