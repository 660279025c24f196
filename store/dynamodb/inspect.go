package dynamodb

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/waitset"
)

// Inspect implements store.Inspector with one strongly consistent GetItem,
// judged on the store's clock. Errors: store.ErrInvalid, store.ErrCorrupt, the
// SDK's wrapped.
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	if err := store.ValidateInspect(id); err != nil {
		return store.Info{}, err
	}
	info, _, err := s.inspect(ctx, id)
	if err != nil {
		return store.Info{}, fmt.Errorf("idemkey/store/dynamodb: inspect: %w", err)
	}
	return info, nil
}

func (s *Store) inspect(ctx context.Context, id store.ID) (store.Info, *record, error) {
	r, err := s.read(ctx, partitionKey(id))
	now := s.nowMS()
	if err != nil {
		return store.Info{}, nil, err
	}
	info := store.Info{Now: fromMS(now)}
	if r.expires <= now {
		return info, nil, nil
	}
	info.Fingerprint, info.CreatedAt, info.ExpiresAt = r.fp, fromMS(r.created), fromMS(r.expires)
	if r.hasStatus {
		info.State, info.CompletedAt = store.StateCompleted, fromMS(r.completed)
		info.Status, info.BodyBytes, info.BodyOmitted = r.status, len(r.body), r.omitted
	} else {
		info.State, info.LeaseUntil = store.StateInFlight, fromMS(r.lease)
	}
	return info, r, nil
}

// Evict implements store.Inspector: a strongly consistent GetItem, the
// judgement against policy, and a DeleteItem conditioned on the record being
// the one judged (same token, same lease, same completion state), so a record
// claimed, renewed or completed in between is judged again (at most 8 times).
// Two round trips, unlike the transitions.
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	if err := store.ValidateEvict(id, policy); err != nil {
		return store.Info{}, false, err
	}
	for range claimAttempts {
		found, r, err := s.inspect(ctx, id)
		if err != nil {
			return store.Info{}, false, fmt.Errorf("idemkey/store/dynamodb: evict: %w", err)
		}
		if !policy.Allows(found) {
			return found, false, nil
		}
		cond, vals := "tok = :tok AND attribute_exists(st)", map[string]types.AttributeValue{":tok": bin(r.token[:])}
		if !r.hasStatus {
			cond = "tok = :tok AND attribute_not_exists(st) AND ls = :ls"
			vals[":ls"] = num(r.lease)
		}
		_, err = s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName: &s.table, Key: keyOf(id),
			ConditionExpression: aws.String(cond), ExpressionAttributeValues: vals,
		})
		switch {
		case err == nil:
			return found, true, nil
		case !isConditionFailed(err):
			return store.Info{}, false, fmt.Errorf("idemkey/store/dynamodb: evict: %w", err)
		}
	}
	return store.Info{}, false, fmt.Errorf("idemkey/store/dynamodb: evict: no definite answer after %d attempts under contention", claimAttempts)
}

// Wait implements store.Waiter by polling: DynamoDB has no notifications, so
// Wait reads whether id holds a live claim (one strongly consistent GetItem of
// three small attributes) at once and then with back-off (WithPollInterval,
// through waitset.Poll) until it does not (nil) or ctx ends (ctx.Err()).
// Errors: store.ErrInvalid for an invalid ID, ctx.Err(), the SDK's wrapped.
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	if err := id.Validate(); err != nil {
		return err
	}
	key := keyOf(id)
	return waitset.Poll(ctx, s.pollFirst, s.pollMax, func(ctx context.Context) (bool, error) {
		out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: &s.table, Key: key, ConsistentRead: aws.Bool(true),
			ProjectionExpression: aws.String("ls, ex, st"),
		})
		if err != nil {
			return false, fmt.Errorf("idemkey/store/dynamodb: wait: %w", err)
		}
		d := decoder{item: out.Item}
		r := record{}
		r.lease, r.hasLease = d.number(attrLease, false)
		r.expires, _ = d.number(attrExpires, false)
		_, r.hasStatus = d.number(attrStatus, false)
		if d.err != nil {
			return false, fmt.Errorf("idemkey/store/dynamodb: wait: %w", d.err)
		}
		return r.live(s.nowMS()), nil
	})
}

// Ping implements store.Pinger: one GetItem of a key no record has, so it
// checks that the table answers with the permissions the store uses, and
// changes nothing.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: &s.table, Key: map[string]types.AttributeValue{attrKey: bin(partitionKey(store.ID{}))},
	})
	if err != nil {
		return fmt.Errorf("idemkey/store/dynamodb: ping: %w", err)
	}
	return nil
}
