package dynamodb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/waitset"
)

// DefaultTable is the records table's name when WithTable is not given.
const DefaultTable = "idemkey_records"

// claimAttempts bounds how often Claim writes again after a refusal that turned
// out not to decide (the record expired, was released or taken over between the
// refused write and the read that explains it).
const claimAttempts = 8

// Store is the DynamoDB idempotency store. It is safe for concurrent use; build
// it with New and create its table with Migrate (or as docs/stores.md shows).
type Store struct {
	db        *dynamodb.Client
	table     string
	now       func() time.Time
	pollFirst time.Duration
	pollMax   time.Duration
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Waiter    = (*Store)(nil)
	_ store.Inspector = (*Store)(nil)
	_ store.Pinger    = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithTable sets the records table's name (default DefaultTable): 3-255 of
// a-z, A-Z, 0-9, '_', '-' and '.', as DynamoDB allows.
func WithTable(name string) Option { return func(s *Store) { s.table = name } }

// WithClock sets the clock that decides leases and retention (default
// time.Now). DynamoDB has no clock in its expressions: the caller's clock is
// passed as a value in every conditional write, so the clocks of all the
// application's replicas must agree to well within a lease (see the package
// doc). Tests use it to step time.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithPollInterval sets the back-off of Wait, which polls the key's item
// (DynamoDB has no notifications): defaults waitset.DefaultPollFirst (5 ms)
// doubling to waitset.DefaultPollMax (250 ms); both positive, max at least first.
func WithPollInterval(first, max time.Duration) Option {
	return func(s *Store) { s.pollFirst, s.pollMax = first, max }
}

// New returns a store that keeps its records in a table of db (a client from
// dynamodb.NewFromConfig). It does no I/O; call Migrate once, or create the
// table beforehand. Errors wrap store.ErrInvalid (nil client, bad table name,
// nil clock, bad poll interval).
func New(db *dynamodb.Client, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("idemkey/store/dynamodb: %w: nil client", store.ErrInvalid)
	}
	s := &Store{db: db, table: DefaultTable, now: time.Now,
		pollFirst: waitset.DefaultPollFirst, pollMax: waitset.DefaultPollMax}
	for _, o := range opts {
		o(s)
	}
	switch {
	case !validTable(s.table):
		return nil, fmt.Errorf("idemkey/store/dynamodb: %w: table name %q must be 3-255 of a-z A-Z 0-9 _ - .", store.ErrInvalid, s.table)
	case s.now == nil:
		return nil, fmt.Errorf("idemkey/store/dynamodb: %w: nil clock", store.ErrInvalid)
	case s.pollFirst <= 0 || s.pollMax < s.pollFirst:
		return nil, fmt.Errorf("idemkey/store/dynamodb: %w: poll interval %v up to %v: both must be positive, the second at least the first", store.ErrInvalid, s.pollFirst, s.pollMax)
	}
	return s, nil
}

func validTable(name string) bool {
	if len(name) < 3 || len(name) > 255 {
		return false
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}

// Table returns the records table's name.
func (s *Store) Table() string { return s.table }

// nowMS is the store's clock in Unix milliseconds.
func (s *Store) nowMS() int64 { return unixMS(s.now()) }

// holderCondition is true while token holds the record uncompleted within its
// retention: the fence of Complete, Release and Renew.
const holderCondition = "tok = :tok AND attribute_not_exists(st) AND ex > :now"

// Complete implements store.Store in one conditional UpdateItem, fenced by the
// token (holderCondition), otherwise store.ErrLeaseLost; a record token
// completed with the same status, body and omitted mark (a completion retried
// after its reply was lost) answers nil, told by the item the refusal carries
// (ALL_OLD: no extra call). A response whose item
// would exceed DynamoDB's 400 KB limit is kept with its body omitted
// (store.Response.BodyOmitted): a replay carries status and headers and says
// so. Bad arguments give store.ErrInvalid; the SDK's errors are wrapped.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	pk := partitionKey(id)
	now := s.nowMS()
	ex := now + leaseMillis(retention)
	header := encodeHeader(resp)
	body, omitted := resp.Body, resp.BodyOmitted
	if !bodyFits(len(pk), len(header), len(body)) {
		body, omitted = nil, true
	}
	set := "SET st = :st, om = :om, cd = :now, ex = :ex, #t = :ttl"
	vals := map[string]types.AttributeValue{
		":st": num(int64(resp.Status)), ":om": &types.AttributeValueMemberBOOL{Value: omitted},
		":now": num(now), ":ex": num(ex), ":ttl": num(ttlSeconds(ex)), ":tok": bin(token[:]),
	}
	if len(header) > 0 {
		set += ", hd = :hd"
		vals[":hd"] = bin(header)
	}
	if len(body) > 0 {
		set += ", bd = :bd"
		vals[":bd"] = bin(body) // the SDK serialises it before UpdateItem returns
	}
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.table, Key: map[string]types.AttributeValue{attrKey: bin(pk)},
		UpdateExpression:                    aws.String(set + " REMOVE ls"),
		ConditionExpression:                 aws.String(holderCondition),
		ExpressionAttributeNames:            map[string]string{"#t": attrTTL},
		ExpressionAttributeValues:           vals,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if ccf := conditionFailed(err); ccf != nil {
		return s.completedBy(ctx, pk, ccf, token, store.Response{Status: resp.Status, Body: body, BodyOmitted: omitted}, now)
	}
	return holderResult("complete", err)
}

// completedBy answers a refused completion (ccf): nil when token completed the
// record with stored's status, body and omitted mark already (a completion
// retried after its reply was lost), otherwise store.ErrLeaseLost. The refusal
// carries the item (ALL_OLD); a server that sends none is read once.
func (s *Store) completedBy(ctx context.Context, pk []byte, ccf *types.ConditionalCheckFailedException, token store.Token,
	stored store.Response, now int64) error {
	var r *record
	var err error
	if len(ccf.Item) > 0 {
		r, err = decode(ccf.Item)
	} else {
		r, err = s.read(ctx, pk)
	}
	switch {
	case err != nil:
		return fmt.Errorf("idemkey/store/dynamodb: complete: %w", err)
	case r.hasStatus && r.token == token && r.expires > now && r.status == stored.Status &&
		r.omitted == stored.BodyOmitted && bytes.Equal(r.body, stored.Body):
		return nil
	}
	return fmt.Errorf("idemkey/store/dynamodb: complete: %w", store.ErrLeaseLost)
}

// bodyFits reports whether a completed item with a key, headers and body of
// these sizes stays within MaxItemBytes.
func bodyFits(key, header, body int) bool {
	return body == 0 || key+header+body+itemOverhead <= MaxItemBytes
}

// Release implements store.Store in one conditional DeleteItem, fenced by the
// token (holderCondition), otherwise store.ErrLeaseLost.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	_, err := s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &s.table, Key: keyOf(id),
		ConditionExpression:       aws.String(holderCondition),
		ExpressionAttributeValues: map[string]types.AttributeValue{":tok": bin(token[:]), ":now": num(s.nowMS())},
	})
	return holderResult("release", err)
}

// Renew implements store.Store: one conditional UpdateItem, fenced by the token,
// sets the lease to lease from now. When the new lease would outlive the
// retention (DynamoDB cannot take the larger of two values in one update), a
// second conditional UpdateItem stretches the retention to the lease; so a
// refused renewal costs two writes. store.ErrLeaseLost when the token does not
// hold the record.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	now := s.nowMS()
	until := now + leaseMillis(lease)
	vals := map[string]types.AttributeValue{":tok": bin(token[:]), ":now": num(now), ":ls": num(until)}
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.table, Key: keyOf(id),
		UpdateExpression:          aws.String("SET ls = :ls"),
		ConditionExpression:       aws.String(holderCondition + " AND ex >= :ls"),
		ExpressionAttributeValues: vals,
	})
	if !isConditionFailed(err) {
		return holderResult("renew", err)
	}
	vals[":ttl"] = num(ttlSeconds(until))
	_, err = s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.table, Key: keyOf(id),
		UpdateExpression:          aws.String("SET ls = :ls, ex = :ls, #t = :ttl"),
		ConditionExpression:       aws.String(holderCondition + " AND ex < :ls"),
		ExpressionAttributeNames:  map[string]string{"#t": attrTTL},
		ExpressionAttributeValues: vals,
	})
	return holderResult("renew", err)
}

// holderResult maps a fenced write's error: a failed condition means the token
// no longer holds the key.
func holderResult(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case isConditionFailed(err):
		return fmt.Errorf("idemkey/store/dynamodb: %s: %w", op, store.ErrLeaseLost)
	}
	return fmt.Errorf("idemkey/store/dynamodb: %s: %w", op, err)
}

// conditionFailed returns the refusal of a conditional write, or nil.
func conditionFailed(err error) *types.ConditionalCheckFailedException {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return ccf
	}
	return nil
}

func isConditionFailed(err error) bool { return conditionFailed(err) != nil }
