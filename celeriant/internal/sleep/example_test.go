package sleep_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/celeriant/internal/sleep"
)

func ExampleCtx() {
	fmt.Println(sleep.Ctx(context.Background(), time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fmt.Println(sleep.Ctx(ctx, time.Hour))
	// Output:
	// <nil>
	// context canceled
}
