package wire

import (
	"errors"
	"fmt"
)

// ErrProtocol is wrapped by every error of this package: a frame or message could not
// be decoded, or broke a rule of docs/celeriant-protocol.md sections 2-4. Package
// celeriant exports the same value as celeriant.ErrProtocol.
var ErrProtocol = errors.New("celeriant: protocol error")

// Errorf returns an error wrapping ErrProtocol with the formatted text.
func Errorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
}

func errProtocolf(format string, args ...any) error { return Errorf(format, args...) }
