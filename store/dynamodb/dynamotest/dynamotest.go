// Package dynamotest connects to the DynamoDB-compatible server of the tests
// (DYNAMODB_ENDPOINT, dynalite in CI) and gives each test a table of its own,
// for the tests of store/dynamodb and of the modules that run it (the tiered
// store's suite).
package dynamotest

import (
	"context"
	"net/http"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	idemdynamo "github.com/idemkey/idemkey/store/dynamodb"
)

// Client returns a client of DYNAMODB_ENDPOINT (such as http://127.0.0.1:8000)
// with static test credentials, in AWS_REGION (default us-east-1). Without
// DYNAMODB_ENDPOINT the test is skipped, unless CI=true: then it fails.
// transport, if not nil, carries the client's requests (to count them).
func Client(t testing.TB, transport http.RoundTripper) *dynamodb.Client {
	t.Helper()
	endpoint := testenv.Getenv(t, "DYNAMODB_ENDPOINT", "a DynamoDB-compatible server (dynalite)")
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = "us-east-1"
	}
	cfg := aws.Config{
		Region:      region,
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	}
	if transport != nil {
		cfg.HTTPClient = &http.Client{Transport: transport}
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(endpoint) })
}

// Table creates a records table of its own (random name) with Migrate and
// deletes it when the test ends; it returns the name.
func Table(t testing.TB, c *dynamodb.Client) string {
	t.Helper()
	name := "idemkey_test_" + store.NewToken().String()[:12]
	s, err := idemdynamo.New(c, idemdynamo.WithTable(name))
	if err != nil {
		t.Fatalf("dynamodb.New: %v", err)
	}
	t.Cleanup(func() {
		if _, err := c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: &name}); err != nil {
			t.Errorf("delete table %s: %v", name, err)
		}
	})
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return name
}

// Store returns a store on table (see Table). Records of different stores on
// one table are apart as long as their keys are: the suites use random keys.
func Store(t testing.TB, c *dynamodb.Client, table string, opts ...idemdynamo.Option) *idemdynamo.Store {
	t.Helper()
	s, err := idemdynamo.New(c, append([]idemdynamo.Option{idemdynamo.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("dynamodb.New: %v", err)
	}
	return s
}
