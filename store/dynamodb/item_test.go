package dynamodb

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemkey/idemkey/store"
)

// validItem is a completed record's item as Complete leaves it.
func validItem() map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrKey: bin([]byte{0, 'k'}), attrFP: bin(make([]byte, 32)), attrToken: bin(make([]byte, 16)),
		attrExpires: num(2000), attrTTL: num(2), attrCreated: num(1000), attrCompleted: num(1500),
		attrStatus: num(201), attrHeader: bin([]byte{1, 1, 1, 'A', 1, 1, 'b'}), attrBody: bin([]byte("body")),
		attrOmitted: &types.AttributeValueMemberBOOL{},
	}
}

// FuzzDecode: an item with any attribute removed or replaced by a value of
// another type or a malformed one (foreign data under the store's key, an
// item of another version) decodes to store.ErrCorrupt or to a record the
// claim's answer accepts or refuses with store.ErrCorrupt; never a panic.
func FuzzDecode(f *testing.F) {
	f.Add(uint16(0), uint8(0), "")
	f.Add(uint16(1), uint8(1), "x")
	f.Add(uint16(4), uint8(2), "1e400")
	f.Fuzz(func(t *testing.T, drop uint16, kind uint8, s string) {
		item := validItem()
		names := []string{attrFP, attrToken, attrLease, attrExpires, attrCreated, attrCompleted, attrStatus, attrHeader, attrBody, attrOmitted}
		for i, name := range names {
			if drop&(1<<i) == 0 {
				continue
			}
			switch (int(kind) + i) % 4 {
			case 0:
				delete(item, name)
			case 1:
				item[name] = &types.AttributeValueMemberS{Value: s}
			case 2:
				item[name] = &types.AttributeValueMemberN{Value: s}
			case 3:
				item[name] = bin([]byte(s))
			}
		}
		r, err := decode(item)
		if err != nil {
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("decode error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if _, err := r.answer(r.fp, 1200, 0); err != nil && !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("answer error %v does not wrap ErrCorrupt", err)
		}
	})
}

// TestDecodeValid: the item Complete writes decodes to its record.
func TestDecodeValid(t *testing.T) {
	r, err := decode(validItem())
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.answer(r.fp, 1200, 0)
	if err != nil || res.Outcome != store.Completed || res.Record.Status != 201 || string(res.Record.Body) != "body" ||
		res.Record.Header.Get("A") != "b" || !res.Record.ExpiresAt.Equal(time.UnixMilli(2000)) {
		t.Fatalf("answer: %+v %v", res, err)
	}
}

// TestPartitionKeyUnambiguous: distinct IDs never share a hash key, and the
// empty ID (Ping's) is no valid ID's.
func TestPartitionKeyUnambiguous(t *testing.T) {
	seen := map[string]store.ID{string(partitionKey(store.ID{})): {}}
	for _, scope := range []string{"", "a", "a:", "a:b", "\x00", "\x01a", string(make([]byte, 200))} {
		for _, key := range []string{"b", ":b", "b:c", "a:b", "\x00", strconv.Itoa(len(scope))} {
			id := store.ID{Scope: scope, Key: key}
			pk := string(partitionKey(id))
			if prev, ok := seen[pk]; ok {
				t.Fatalf("%q and %q share the hash key %q", prev, id, pk)
			}
			seen[pk] = id
		}
	}
}
