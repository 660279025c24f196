package middleware

import (
	"errors"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
)

// featureConfig holds the settings of the request rules (docs/request-rules.md):
// FingerprintRule.Body, ReplayRule.OnReplay, ProblemRule.TypeBase, and, resolved
// from policy.Config by New, KeyRule.Validate and RetentionRule.Max.
type featureConfig struct {
	fpRule       *fingerprint.Rule
	onReplay     func(r *http.Request, h http.Header)
	keyValidator func(key string) error
	typeBase     string
	maxRetention time.Duration
}

// featureState is what New derives from featureConfig.
type featureState struct {
	ruleChangedBody []byte // the 422 fingerprint_rule_changed problem
	links           *links // Link field values, with ProblemRule.TypeBase
}

// initFeatures checks the feature options and renders what they need; New's
// error.
func (m *Middleware) initFeatures() error {
	if m.fpRule != nil && m.fpRule.ID() == "" {
		return errors.New("idemkey/middleware: fingerprint rule without an identity (build it with a fingerprint constructor)")
	}
	if err := checkTypeBase(m.typeBase); err != nil {
		return err
	}
	var err error
	m.ruleChangedBody, err = problem{Title: "Idempotency key reused under another fingerprint rule",
		Status: http.StatusUnprocessableEntity, Code: CodeRuleChanged,
		Detail: "This idempotency key was first used when this operation fingerprinted requests by another rule, so this request cannot be compared with the first; use a new key."}.renderErr(m.problemStyle())
	if err != nil {
		return err
	}
	if m.typeBase != "" {
		m.links = newLinks(m.typeBase)
	}
	return nil
}
