package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/policy"
)

// TestValidateNamesTheField: every duration field refuses a negative value with
// an error naming it, and the zero Config (every default) is valid.
func TestValidateNamesTheField(t *testing.T) {
	if err := (policy.Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	for name, set := range map[string]func(*policy.Config){
		"Lease":                          func(c *policy.Config) { c.Lease = -1 },
		"Retention.Default":              func(c *policy.Config) { c.Retention.Default = -1 },
		"Retention.Max":                  func(c *policy.Config) { c.Retention.Max = -1 },
		"StoreFailure.RetryAfter":        func(c *policy.Config) { c.StoreFailure.RetryAfter = -1 },
		"StoreFailure.Timeouts.Claim":    func(c *policy.Config) { c.StoreFailure.Timeouts.Claim = -1 },
		"StoreFailure.Timeouts.Complete": func(c *policy.Config) { c.StoreFailure.Timeouts.Complete = -1 },
		"StoreFailure.Timeouts.Release":  func(c *policy.Config) { c.StoreFailure.Timeouts.Release = -1 },
		"StoreFailure.Timeouts.Renew":    func(c *policy.Config) { c.StoreFailure.Timeouts.Renew = -1 },
		"WaitInFlight":                   func(c *policy.Config) { c.WaitInFlight = -1 },
		"Key.Header":                     func(c *policy.Config) { c.Key.Header = "Idempotency Key" },
	} {
		var c policy.Config
		set(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, c := range map[string]policy.Config{
		"Lease":         {Lease: claim.MinLease - 1},
		"Retention.Max": {Retention: policy.RetentionRule{Default: time.Hour, Max: time.Minute}},
		"Renew":         {Lease: time.Second, StoreFailure: policy.StoreFailureRule{Timeouts: claim.Timeouts{Renew: 2 * time.Second}}},
		"Default":       {Lease: time.Hour, Retention: policy.RetentionRule{Default: time.Minute}},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	d := policy.Config{}.WithDefaults()
	if d.Key.Header != policy.DefaultKeyHeader || d.Lease != claim.DefaultLease || d.Retention.Default != claim.DefaultRetention ||
		d.StoreFailure.RetryAfter != policy.DefaultStoreRetryAfter || d.Retention.Max != 0 || d.WaitInFlight != 0 || d.Key.Optional || d.StoreFailure.FailOpen {
		t.Fatalf("%+v", d)
	}
}
