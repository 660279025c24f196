package codec

import (
	"fmt"

	"github.com/idemkey/idemkey/store"
)

// DecodeResponse checks and decodes a stored response as a SQL store reads its
// columns (store/postgres, store/mysql): status, the headers in the encoding of
// EncodeHeader, the body and its omitted mark. maxBody is the store's body cap
// (0: none). Errors wrap store.ErrCorrupt: a status outside 100-999, a body next
// to the omitted mark, a body over the cap, headers that do not decode. body is
// kept as the Response's Body (nil when empty).
func DecodeResponse(status int, headers, body []byte, omitted bool, maxBody int) (store.Response, error) {
	switch {
	case status < 100 || status > 999:
		return store.Response{}, fmt.Errorf("%w: status %d outside 100-999", store.ErrCorrupt, status)
	case omitted && len(body) > 0:
		return store.Response{}, fmt.Errorf("%w: body stored although marked omitted", store.ErrCorrupt)
	case maxBody > 0 && len(body) > maxBody:
		return store.Response{}, fmt.Errorf("%w: stored body of %d bytes over the cap of %d", store.ErrCorrupt, len(body), maxBody)
	}
	h, err := DecodeHeader(string(headers))
	if err != nil {
		return store.Response{}, err
	}
	return store.Response{Status: status, Header: h, Body: body, BodyOmitted: omitted}, nil
}
