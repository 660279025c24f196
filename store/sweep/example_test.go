package sweep_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store/sweep"
)

// A store's StartSweeper is one call: its own Sweep, its logger, its name.
func ExampleStart() {
	deleteExpired := func(ctx context.Context) (int64, error) { return 0, nil } // the store's Sweep(ctx, 0)
	stop := sweep.Start(context.Background(), time.Minute, deleteExpired, nil, "idemkey/example", "table", "idemkey_records")
	stop() // at shutdown: waits for a sweep in progress
	fmt.Println("stopped")
	// Output: stopped
}
