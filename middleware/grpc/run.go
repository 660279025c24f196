package idemgrpc

import (
	"context"
	"errors"
	"log/slog"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// The reasons of the ErrorInfo details: the HTTP middleware's problem codes.
const (
	codeKeyMissing  = middleware.CodeKeyMissing
	codeKeyInvalid  = middleware.CodeKeyInvalid
	codeInFlight    = middleware.CodeInFlight
	codeMismatch    = middleware.CodeMismatch
	codeUnavailable = middleware.CodeStoreUnavailable
)

// minInFlightRetry is the least RetryInfo delay of an ABORTED answer, the HTTP
// middleware's least Retry-After.
const minInFlightRetry = time.Second

// errNotStored makes idem release the key: the handler's answer is one to run
// again (the release rule), or cannot be stored.
var errNotStored = errors.New("idemkey/middleware/grpc: answer not stored")

// run executes the call under the claim of id (in the one-transaction mode when
// inTx: WithOneTx), or answers why not.
func (ic *Interceptor) run(ctx context.Context, id store.ID, fp store.Fingerprint, req any, handler grpc.UnaryHandler, inTx bool) (any, error) {
	var (
		resp any
		herr error
		ran  bool
	)
	// Detached: neither the claim nor the handler stops when the client gives up
	// (package claim bounds the claim by the store timeout); the handler's
	// context is cancelled only when the lease is lost.
	fn := func(fnCtx context.Context) ([]byte, error) {
		ran = true
		resp, herr = handler(context.WithValue(fnCtx, ctxKey{}, id), req)
		return ic.record(resp, herr)
	}
	var res idem.Result
	var err error
	if inTx {
		res, err = ic.runner.DoTx(context.WithoutCancel(ctx), id, fp, fn)
	} else {
		res, err = ic.runner.Do(context.WithoutCancel(ctx), id, fp, fn)
	}
	if ran {
		return ic.ran(ctx, id, resp, herr, err, inTx)
	}
	var inFlight *idem.InFlightError
	switch {
	case err == nil && res.Replayed:
		return ic.replay(ctx, res.Value)
	case errors.As(err, &inFlight):
		return nil, problem(codes.Aborted, codeInFlight,
			"A call with this idempotency key is still being processed; retry after the RetryInfo delay.",
			max(inFlight.RetryAfter, minInFlightRetry))
	case errors.Is(err, idem.ErrMismatch):
		return nil, problem(codes.FailedPrecondition, codeMismatch,
			"This idempotency key was already used for a different call (method or request message); use a new key.", 0)
	case errors.Is(err, store.ErrInvalid):
		return nil, problem(codes.InvalidArgument, codeKeyInvalid, "The idempotency store does not accept this key or its scope.", 0)
	}
	ic.logger.LogAttrs(ctx, slog.LevelDebug, "idempotency store failed; answering UNAVAILABLE",
		slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	return nil, problem(codes.Unavailable, codeUnavailable,
		"The call could not be checked for duplicates and was not processed; retry after the RetryInfo delay.", ic.storeRetryAfter)
}

// ran answers a call whose handler ran: its answer, unless in the
// one-transaction mode its rows did not commit (err, not the release rule's
// errNotStored), or were rolled back under a success that cannot be stored:
// then UNAVAILABLE or INTERNAL, never a success for rows that do not exist.
func (ic *Interceptor) ran(ctx context.Context, id store.ID, resp any, herr, err error, inTx bool) (any, error) {
	stored := err == nil || errors.Is(err, errNotStored)
	if !stored {
		ic.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency: the call's answer was not stored",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	}
	switch {
	case !inTx:
		return resp, herr
	case !stored:
		return nil, problem(codes.Unavailable, codeUnavailable,
			"The call's transaction did not commit, or its outcome is unknown; retry after the RetryInfo delay.", ic.storeRetryAfter)
	case err != nil && herr == nil: // a success that cannot be stored: its transaction was rolled back
		return nil, status.Errorf(codes.Internal, "idemkey/middleware/grpc: the response cannot be stored, so the call's transaction was rolled back")
	}
	return resp, herr
}

// record returns the stored form of the handler's answer: a google.rpc.Status
// whose only detail is the response message (code OK), or the handler's
// status. errNotStored when the release rule releases it, or it cannot be
// stored (a response that is not a proto.Message).
func (ic *Interceptor) record(resp any, herr error) ([]byte, error) {
	var st *spb.Status
	if herr != nil {
		s := status.Convert(herr)
		if s.Code() == codes.OK || ic.release(s.Code()) {
			return nil, errNotStored
		}
		st = s.Proto()
	} else {
		msg, ok := resp.(proto.Message)
		if !ok {
			return nil, errNotStored
		}
		a, err := anypb.New(msg)
		if err != nil {
			return nil, errNotStored
		}
		st = &spb.Status{Details: []*anypb.Any{a}}
	}
	b, err := proto.Marshal(st)
	if err != nil {
		return nil, errNotStored
	}
	return b, nil
}

// replay decodes a stored answer and returns it, marked as a replay.
func (ic *Interceptor) replay(ctx context.Context, stored []byte) (any, error) {
	var st spb.Status
	if err := proto.Unmarshal(stored, &st); err != nil {
		return nil, problem(codes.Unavailable, codeUnavailable, "The stored answer of this idempotency key cannot be read.", ic.storeRetryAfter)
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
	if st.Code != int32(codes.OK) {
		return nil, status.ErrorProto(&st)
	}
	if len(st.Details) != 1 {
		return nil, problem(codes.Unavailable, codeUnavailable, "The stored answer of this idempotency key cannot be read.", ic.storeRetryAfter)
	}
	msg, err := st.Details[0].UnmarshalNew()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemkey/middleware/grpc: the stored response is a %s, which this server cannot decode: %v",
			st.Details[0].GetTypeUrl(), err)
	}
	return msg, nil
}

// problem returns a status error with an ErrorInfo (domain ErrorDomain, the
// reason) and, when retry is positive, a RetryInfo.
func problem(code codes.Code, reason, msg string, retry time.Duration) error {
	st := &spb.Status{Code: int32(code), Message: msg}
	info, _ := anypb.New(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain})
	st.Details = append(st.Details, info)
	if retry > 0 {
		ri, _ := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
		st.Details = append(st.Details, ri)
	}
	return status.ErrorProto(st)
}
