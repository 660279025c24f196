package dynamodb_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkey/idemkey/store/dynamodb"
	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
	"github.com/idemkey/idemkey/store/storetest"
)

// returnsItem is an http.RoundTripper that makes dynalite answer a refused
// conditional PutItem or UpdateItem (a claim, a completion) as DynamoDB does when asked with
// ReturnValuesOnConditionCheckFailure ALL_OLD: the refusal carries the item that
// refused. dynalite ignores the parameter; the transport reads the item right
// after the refusal (a strongly consistent GetItem) and adds it to the error's
// body, so the store's one-request path for a refused claim is exercised.
// When the item is gone by then, the refusal goes back without it, as the
// store's fallback expects. returned counts the refusals it filled.
type returnsItem struct {
	next     http.RoundTripper
	returned atomic.Int64
}

func (rt *returnsItem) RoundTrip(r *http.Request) (*http.Response, error) {
	if op := r.Header.Get("X-Amz-Target"); !strings.HasSuffix(op, ".PutItem") && !strings.HasSuffix(op, ".UpdateItem") {
		return rt.next.RoundTrip(r)
	}
	reqBody, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r = r.Clone(r.Context())
	r.Body = io.NopCloser(bytes.NewReader(reqBody))
	resp, err := rt.next.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil || !bytes.Contains(body, []byte("ConditionalCheckFailedException")) {
		return resp, err
	}
	var in struct {
		TableName                           string
		Item, Key                           map[string]json.RawMessage // PutItem's, UpdateItem's
		ReturnValuesOnConditionCheckFailure string
	}
	if err := json.Unmarshal(reqBody, &in); err != nil || in.ReturnValuesOnConditionCheckFailure != "ALL_OLD" {
		return resp, err
	}
	pk := in.Item["pk"]
	if pk == nil {
		pk = in.Key["pk"]
	}
	item, err := rt.get(r, in.TableName, pk)
	if err != nil || item == nil {
		return resp, err
	}
	var refusal map[string]json.RawMessage
	if err := json.Unmarshal(body, &refusal); err != nil {
		return nil, fmt.Errorf("returnsItem: refusal body: %w", err)
	}
	refusal["Item"] = item
	body, _ = json.Marshal(refusal)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.Header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	rt.returned.Add(1)
	return resp, nil
}

// get reads the item of key (a JSON attribute value), or nil when there is none.
func (rt *returnsItem) get(orig *http.Request, table string, key json.RawMessage) (json.RawMessage, error) {
	b, _ := json.Marshal(map[string]any{"TableName": table, "Key": map[string]json.RawMessage{"pk": key}, "ConsistentRead": true})
	r, err := http.NewRequestWithContext(orig.Context(), http.MethodPost, orig.URL.String(), bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/x-amz-json-1.0")
	r.Header.Set("X-Amz-Target", "DynamoDB_20120810.GetItem")
	r.Header.Set("X-Amz-Date", orig.Header.Get("X-Amz-Date"))
	r.Header.Set("Authorization", orig.Header.Get("Authorization"))
	resp, err := rt.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct{ Item json.RawMessage }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("returnsItem: GetItem: status %d, %v", resp.StatusCode, err)
	}
	if len(out.Item) == 0 || string(out.Item) == "null" {
		return nil, nil
	}
	return out.Item, nil
}

// TestConformanceReturnsItem runs the suite with every refused claim answered
// from the item returned with the refusal, as on DynamoDB: the path a replay,
// a duplicate in flight, a mismatch and a takeover take there. It fails when
// that path is never taken.
func TestConformanceReturnsItem(t *testing.T) {
	rt := &returnsItem{next: http.DefaultTransport}
	c := dynamotest.Client(t, rt)
	table := dynamotest.Table(t, c)
	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Subject {
			return storetest.Subject{Store: dynamotest.Store(t, c, table), MaxBody: dynamodb.MaxItemBytes}
		})
	})
	if n := rt.returned.Load(); n == 0 {
		t.Fatal("no refusal carried its item: the one-request path was not exercised")
	} else {
		t.Logf("%d refusals carried their item", n)
	}
}
