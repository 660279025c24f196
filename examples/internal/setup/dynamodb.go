package setup

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkey/idemkey/store/dynamodb"
)

// DynamoDBStore builds the dynamodb store (IDEM_STORE=dynamodb) in the table
// IDEM_TABLE, created now if missing. The AWS SDK finds the region and
// credentials as usual (AWS_REGION, AWS_PROFILE, a role); DYNAMODB_ENDPOINT
// points it at a local server instead, with region us-east-1 and placeholder
// credentials unless they are set. Errors are the SDK's, wrapped.
func DynamoDBStore(ctx context.Context, env Env, logger *slog.Logger) (*dynamodb.Store, error) {
	var opts []func(*config.LoadOptions) error
	if env.DynamoDBEndpoint != "" && env.AWSRegion == "" {
		opts = append(opts, config.WithRegion("us-east-1"))
	}
	if env.DynamoDBEndpoint != "" && os.Getenv("AWS_ACCESS_KEY_ID") == "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("dynamodb store: %w", err)
	}
	client := awsdynamodb.NewFromConfig(cfg, func(o *awsdynamodb.Options) {
		if env.DynamoDBEndpoint != "" {
			o.BaseEndpoint = aws.String(env.DynamoDBEndpoint)
		}
	})
	st, err := dynamodb.New(client, dynamodb.WithTable(env.IdemTable))
	if err != nil {
		return nil, fmt.Errorf("dynamodb store: %w", err)
	}
	ttl, err := st.Migrate(ctx)
	if err != nil {
		return nil, fmt.Errorf("dynamodb store: %w", err)
	}
	if !ttl {
		logger.Warn("dynamodb: the server has no TTL: expired records are ignored but never deleted", "table", env.IdemTable)
	}
	return st, nil
}
