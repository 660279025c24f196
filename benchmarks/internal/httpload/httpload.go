// Package httpload is what the loopback and end-to-end benchmarks share: the
// request they send, the server's CPU time they read, and the process CPU time
// the servers report.
package httpload

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Send posts body to url with key as its Idempotency-Key (scope tenant-1) and
// fails unless the answer is 201.
func Send(cl *http.Client, url, key string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Client-ID", "tenant-1")
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("key %s: status %d", key, resp.StatusCode)
	}
	return nil
}

// ServerCPU asks the server at base for the CPU time it used so far (GET
// base/cpu, nanoseconds).
func ServerCPU(cl *http.Client, base string) (int64, error) {
	resp, err := cl.Get(base + "/cpu")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// JSONBody returns a JSON request body of n bytes (n >= 80).
func JSONBody(n int) []byte {
	b := []byte(`{"fromAccountId":"acc-1","toAccountId":"acc-2","amountCents":1234,"memo":"`)
	b = append(b, strings.Repeat("m", n-len(b)-2)...)
	return append(b, `"}`...)
}

// Median is the median of xs (0 for none); xs is not changed.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
