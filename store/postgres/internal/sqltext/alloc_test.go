package sqltext

import "testing"

func TestEndsTxNoAlloc(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { EndsTx(`INSERT INTO orders (key, amount) VALUES ($1, $2) RETURNING id`) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
