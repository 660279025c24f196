package dynamodb

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// claimCondition lets a claim's PutItem write a new record: the key is absent
// or its record is past its retention (TTL deletion is lazy, so an expired item
// may still be there).
const claimCondition = "attribute_not_exists(pk) OR ex <= :now"

// takeoverCondition lets a claim take over the record it read: still held by
// the token it read, uncompleted, lease expired, retention not. The token in
// the condition makes the takeover as exclusive as a first claim.
const takeoverCondition = "tok = :old AND attribute_not_exists(st) AND ls <= :now AND ex > :now"

// Claim implements store.Store (see the package doc). A new key is one
// conditional PutItem. A refused PutItem answers from the record that refused
// it: DynamoDB returns it with the refusal (ReturnValuesOnConditionCheckFailure
// ALL_OLD), and a server that does not (dynalite) costs one strongly
// consistent GetItem more. A record whose lease expired is taken over with a
// conditional UpdateItem fenced by the token read. When the record changed in
// between (released, expired, taken over), Claim writes again, at most 8
// times. Errors: store.ErrInvalid for bad arguments, store.ErrCorrupt for an
// undecodable item, otherwise the SDK's error wrapped.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	tok := req.ClaimToken()
	pk := partitionKey(req.ID)
	for range claimAttempts {
		now := s.nowMS()
		old, err := s.put(ctx, pk, req, tok, now)
		switch {
		case err != nil:
			return store.ClaimResult{}, fmt.Errorf("idemkey/store/dynamodb: claim: %w", err)
		case old == nil:
			return store.ClaimResult{Outcome: store.Claimed, Token: tok}, nil
		case old.expires <= now:
			continue // expired after the refusal: write again
		case !old.takeable(req.Fingerprint, now):
			return old.answer(req.Fingerprint, now, 0)
		}
		took, err := s.takeover(ctx, pk, req, tok, old.token, now)
		if err != nil {
			return store.ClaimResult{}, fmt.Errorf("idemkey/store/dynamodb: claim: %w", err)
		}
		if took {
			return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: true}, nil
		}
	}
	return store.ClaimResult{}, fmt.Errorf("idemkey/store/dynamodb: claim: no definite answer after %d attempts under contention", claimAttempts)
}

// put writes a new record for req unless a live one is there. It returns nil
// when it wrote, else the record that refused it (a record with expires 0 when
// that one is gone by the time it is read).
func (s *Store) put(ctx context.Context, pk []byte, req store.ClaimRequest, tok store.Token, now int64) (*record, error) {
	ex := now + leaseMillis(req.Retention)
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: &s.table,
		Item: map[string]types.AttributeValue{
			attrKey: bin(pk), attrFP: bin(req.Fingerprint[:]), attrToken: bin(tok[:]),
			attrLease: num(now + leaseMillis(req.Lease)), attrExpires: num(ex), attrTTL: num(ttlSeconds(ex)),
			attrCreated: num(now),
		},
		ConditionExpression:                 aws.String(claimCondition),
		ExpressionAttributeValues:           map[string]types.AttributeValue{":now": num(now)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	ccf := conditionFailed(err)
	switch {
	case err == nil:
		return nil, nil
	case ccf == nil:
		return nil, err
	case len(ccf.Item) > 0:
		return decode(ccf.Item)
	}
	return s.read(ctx, pk)
}

// read is a strongly consistent GetItem of pk's record; an absent one is
// returned as a record with expires 0 (expired at any time).
func (s *Store) read(ctx context.Context, pk []byte) (*record, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: &s.table, Key: map[string]types.AttributeValue{attrKey: bin(pk)}, ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, err
	}
	if len(out.Item) == 0 {
		return &record{}, nil
	}
	return decode(out.Item)
}

// takeover takes over the record held by old for req with a fresh lease and
// retention, keeping its creation time; false when the record changed since it
// was read.
func (s *Store) takeover(ctx context.Context, pk []byte, req store.ClaimRequest, tok, old store.Token, now int64) (bool, error) {
	ex := now + leaseMillis(req.Retention)
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.table, Key: map[string]types.AttributeValue{attrKey: bin(pk)},
		UpdateExpression:         aws.String("SET tok = :tok, ls = :ls, ex = :ex, #t = :ttl"),
		ConditionExpression:      aws.String(takeoverCondition),
		ExpressionAttributeNames: map[string]string{"#t": attrTTL},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":tok": bin(tok[:]), ":old": bin(old[:]), ":now": num(now),
			":ls": num(now + leaseMillis(req.Lease)), ":ex": num(ex), ":ttl": num(ttlSeconds(ex)),
		},
	})
	if isConditionFailed(err) {
		return false, nil
	}
	return err == nil, err
}

// encodeHeader is the stored form of resp's headers (store/codec), nil when none.
func encodeHeader(resp store.Response) []byte { return codec.EncodeHeader(resp.Header) }
