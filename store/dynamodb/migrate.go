package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// Migrate creates the records table if it does not exist (on-demand capacity,
// hash key pk of type B), waits until it is active (at most 2 minutes), and
// enables DynamoDB's TTL on the ttl attribute. A server without TTL
// (UpdateTimeToLive unknown, as on dynalite) is tolerated: expired records are
// then never deleted, but the store treats them as absent all the same, and
// ttl is false. ttl is true when TTL is on (now or before). It is idempotent.
// Errors are the SDK's, wrapped.
func (s *Store) Migrate(ctx context.Context) (ttl bool, err error) {
	_, err = s.db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            &s.table,
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrKey), AttributeType: types.ScalarAttributeTypeB}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrKey), KeyType: types.KeyTypeHash}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return false, fmt.Errorf("idemkey/store/dynamodb: migrate: create table %s: %w", s.table, err)
	}
	waiter := dynamodb.NewTableExistsWaiter(s.db, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 100*time.Millisecond, 2*time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: &s.table}, 2*time.Minute); err != nil {
		return false, fmt.Errorf("idemkey/store/dynamodb: migrate: table %s not active: %w", s.table, err)
	}
	_, err = s.db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               &s.table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attrTTL), Enabled: aws.Bool(true)},
	})
	var api smithy.APIError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException":
		return false, nil // a server without TTL (dynalite)
	case errors.As(err, &api) && api.ErrorCode() == "ValidationException" && ttlAlreadyOn(api.ErrorMessage()):
		return true, nil
	}
	return false, fmt.Errorf("idemkey/store/dynamodb: migrate: enable TTL on %s: %w", s.table, err)
}

// ttlAlreadyOn reports whether UpdateTimeToLive refused because TTL is already
// enabled (DynamoDB answers a ValidationException).
func ttlAlreadyOn(msg string) bool {
	return strings.Contains(msg, "already enabled")
}
