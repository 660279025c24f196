package dynamodb_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
)

// ttlAnswers is an http.RoundTripper that answers UpdateTimeToLive itself with
// status and body, as DynamoDB would, and passes every other request on.
type ttlAnswers struct {
	status int
	body   string
}

func (a ttlAnswers) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".UpdateTimeToLive") {
		return http.DefaultTransport.RoundTrip(r)
	}
	return &http.Response{StatusCode: a.status, Status: strconv.Itoa(a.status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:    io.NopCloser(bytes.NewReader([]byte(a.body))),
		Request: r, ContentLength: int64(len(a.body))}, nil
}

// TestMigrateTTLAnswers: Migrate reports TTL on when DynamoDB turns it on or
// says it already is, off when the server does not know the operation
// (dynalite), and fails on any other refusal.
func TestMigrateTTLAnswers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  ttlAnswers
		ttl     bool
		wantErr bool
	}{
		{"turned on", ttlAnswers{200, `{"TimeToLiveSpecification":{"AttributeName":"ttl","Enabled":true}}`}, true, false},
		{"already on", ttlAnswers{400, `{"__type":"com.amazon.coral.validate#ValidationException","message":"TimeToLive is already enabled"}`}, true, false},
		{"unknown operation", ttlAnswers{400, `{"__type":"com.amazon.coral.service#UnknownOperationException"}`}, false, false},
		{"refused", ttlAnswers{400, `{"__type":"com.amazon.coral.service#AccessDeniedException","message":"no"}`}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := dynamotest.Table(t, dynamotest.Client(t, nil))
			ttl, err := dynamotest.Store(t, dynamotest.Client(t, tc.answer), table).Migrate(t.Context())
			if ttl != tc.ttl || (err != nil) != tc.wantErr {
				t.Fatalf("Migrate = %v, %v; want %v, error %v", ttl, err, tc.ttl, tc.wantErr)
			}
		})
	}
}
