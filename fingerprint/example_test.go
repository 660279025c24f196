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

// A client that adds a trace id or a timestamp to its retry still sends the
// same payment under a rule that covers only the members that matter; a
// changed amount is another request. A body that is not JSON is an error.
func ExampleOnlyJSONFields() {
	rule, err := fingerprint.OnlyJSONFields("/amountCents", "/to")
	if err != nil {
		panic(err) // a path that is not a JSON Pointer fails here
	}
	sum := func(body string) string {
		fp, err := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/payments", Body: []byte(body)},
			fingerprint.Options{Rule: rule})
		if err != nil {
			return "error: " + err.Error()
		}
		return fp.String()
	}
	first := sum(`{"amountCents":500,"to":"acc-2","sentAt":"10:00:00"}`)
	fmt.Println(rule.ID())
	fmt.Println(first == sum(`{"to":"acc-2","amountCents":500,"sentAt":"10:00:05","traceId":"t-9"}`))
	fmt.Println(first == sum(`{"amountCents":900,"to":"acc-2","sentAt":"10:00:00"}`))
	fmt.Println(sum(`amountCents=500`))
	// Output:
	// only-json-fields/v1["/amountCents","/to"]
	// true
	// false
	// error: idemkey/fingerprint: invalid JSON body at byte 0: unexpected byte 'a'
}

// Everything but the volatile members: an ignored member may be absent, and an
// ignored array element keeps the others' places.
func ExampleIgnoreJSONFields() {
	rule, _ := fingerprint.IgnoreJSONFields("/sentAt", "/meta/traceId")
	a, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/orders",
		Body: []byte(`{"sku":"x","qty":2,"sentAt":"10:00","meta":{"traceId":"t1","app":"ios"}}`)}, fingerprint.Options{Rule: rule})
	b, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/orders",
		Body: []byte(`{"meta":{"app":"ios"},"qty":2,"sku":"x"}`)}, fingerprint.Options{Rule: rule})
	fmt.Println(a == b, fingerprint.SameRule(a, rule), fingerprint.SameRule(a, nil))
	// Output: true true false
}
