package storeenv

import (
	"context"
	"fmt"
)

func open(ctx context.Context, name string, getenv func(string) string) (*Store, error) {
	return nil, fmt.Errorf("%w: IDEM_STORE=%q is not one of memory, postgres, redis, tiered", ErrConfig, name)
}
