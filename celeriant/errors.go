package celeriant

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// Transport-level errors. They are sentinels: match with errors.Is. The client wraps the
// underlying cause too, so errors.Is(err, context.DeadlineExceeded) also works.
var (
	// ErrOutcomeUnknown: a write was sent completely and no answer came back (deadline,
	// connection reset, EOF, desynchronised connection). It may have been committed.
	// The client never re-sends it; the caller holds its ClientSeq and retries with
	// EnforceClientIdempotency (docs/account-service.md section 3.3).
	ErrOutcomeUnknown = errors.New("celeriant: write outcome unknown")
	// ErrNotSent: the request did not reach the server as a whole frame (dial failure,
	// context done before sending, short write, request invalid or too large). It had no
	// effect and is safe to retry.
	ErrNotSent = errors.New("celeriant: request not sent")
	// ErrTransport: a Read or AggregateDetails was sent and failed without an answer.
	// Reads have no effect and are safe to retry.
	ErrTransport = errors.New("celeriant: transport failure")
	// ErrClosed: the client or simulator was closed.
	ErrClosed = errors.New("celeriant: closed")
	// ErrProtocol: a frame or message could not be decoded, or broke a rule of
	// docs/celeriant-protocol.md sections 2-4. Decoding errors wrap it.
	ErrProtocol = wire.ErrProtocol
)

func errProtocolf(format string, args ...any) error { return wire.Errorf(format, args...) }

// Class sentinels: errors.Is(err, ErrConflict) is true for a *ServerError whose code is in
// the class (docs/celeriant-protocol.md section 5).
var (
	// ErrConflict is 2003 (optimistic concurrency violation): nothing was appended;
	// re-read, re-decide, new sequence.
	ErrConflict = errors.New("celeriant: optimistic concurrency violation")
	// ErrIdempotencyViolation is 2002: the lowest ClientSeq is <= the committed floor;
	// the sequence is already used (by this write or a sibling's: check the EventId).
	ErrIdempotencyViolation = errors.New("celeriant: client idempotency violation")
	// ErrInflightDuplicate is 2013: the floor is set by a write not yet committed; hold
	// the sequence and retry later. Never a success.
	ErrInflightDuplicate = errors.New("celeriant: in-flight duplicate write")
	// ErrUnavailableVersion is 1000: FromVersion is below the first available version;
	// see ServerError.MinimumAvailable.
	ErrUnavailableVersion = errors.New("celeriant: batch index unavailable")
	// ErrNotFound is 1001 (read), 2005 (write without AllowCreate), 3000 (TrimStart)
	// or 7001 (details).
	ErrNotFound = errors.New("celeriant: aggregate not found")
	// ErrNotLeader is 2011, 3005 or 4006; see ServerError.LeaderAddress.
	ErrNotLeader = errors.New("celeriant: not leader")
	// ErrBusy is 11000, 2012, 3006 or 4007: back off and retry.
	ErrBusy = errors.New("celeriant: server busy")
)

// Code is a Celeriant error code (docs/celeriant-protocol.md section 5). A Code is itself an error, so
// errors.Is(err, celeriant.CodeWriteOCC) matches a *ServerError carrying that code.
type Code uint32

// Error codes of docs/celeriant-protocol.md section 5 (names follow the server's error_codes.rs). Each
// comment gives the meaning and, where one exists, the class sentinel errors.Is matches.
const (
	CodeReadUnavailableVersion       Code = 1000  // FromVersion below the first readable one; ErrUnavailableVersion
	CodeReadAggregateNotExists       Code = 1001  // read of a missing or deleted aggregate; ErrNotFound
	CodeReadCacheLoadLockTimeout     Code = 1002  // cache load contention; resend the same request
	CodeReadCacheLoadFileScan        Code = 1003  // disk-side read failure (JSON "detail")
	CodeReadFetchDatablocks          Code = 1004  // disk-side read failure (JSON "detail")
	CodeReadFetchMetablocks          Code = 1005  // disk-side read failure (JSON "detail")
	CodeWriteEmptyEventsList         Code = 2000  // an AggregateWrite with no events
	CodeWriteZeroEventType           Code = 2001  // an event with TypeMajor 0 (JSON "client_seq")
	CodeWriteClientIdempotency       Code = 2002  // lowest ClientSeq <= committed floor; ErrIdempotencyViolation
	CodeWriteOCC                     Code = 2003  // ExpectedVersion is not the current one; ErrConflict
	CodeWriteSerialiseDatablocks     Code = 2004  // the server could not serialise the batch
	CodeWriteAggregateNotExists      Code = 2005  // aggregate missing and AllowCreate false; ErrNotFound
	CodeWriteRecreateNotAllowed      Code = 2006  // aggregate deleted without allow_recreate
	CodeWriteReplicationError        Code = 2007  // replication failed, outcome unknown: hold ClientSeq
	CodeWriteFsyncError              Code = 2008  // leader fsync failed; the write did not land
	CodeWriteCacheAggregateClient    Code = 2009  // loading the ClientSeq floor failed; resend
	CodeWriteAggregateExistsCache    Code = 2010  // existence check failed; resend
	CodeWriteNotLeader               Code = 2011  // node is a follower; ErrNotLeader
	CodeWriteReplicationBackpressure Code = 2012  // load shedding; ErrBusy
	CodeWriteInflightDuplicate       Code = 2013  // floor not yet committed; ErrInflightDuplicate
	CodeSchemaValidationFailed       Code = 2022  // schema validation failed
	CodeSchemaCompiledCorrupt        Code = 2023  // the stored compiled schema is corrupt
	CodeSchemaNotLeader              Code = 2027  // schema operation sent to a follower
	CodeSchemaCoordinationFailed     Code = 2029  // transient schema coordination failure; resend
	CodeTrimAggregateNotExists       Code = 3000  // TrimStart of a missing aggregate; ErrNotFound
	CodeTrimCacheError               Code = 3001  // TrimStart: the existence check failed; resend
	CodeTrimReplicationError         Code = 3002  // TrimStart: replication failed, outcome unknown
	CodeTrimFsyncError               Code = 3003  // TrimStart: the leader's fsync failed
	CodeTrimIndexOutOfRange          Code = 3004  // TrimStart beyond the current version (JSON "requested", "max_aggregate_version")
	CodeTrimNotLeader                Code = 3005  // trim on a follower; ErrNotLeader
	CodeTrimBackpressure             Code = 3006  // trim load shedding; ErrBusy
	CodeDeleteOCC                    Code = 4002  // delete with a stale expected version
	CodeDeleteNotLeader              Code = 4006  // delete on a follower; ErrNotLeader
	CodeDeleteBackpressure           Code = 4007  // delete load shedding; ErrBusy
	CodeExistsError                  Code = 7000  // AggregateDetails failed on the server
	CodeExistsAggregateNotFound      Code = 7001  // AggregateDetails of a missing aggregate; ErrNotFound
	CodeExistsError2                 Code = 7002  // AggregateDetails failed on the server
	CodeWatchRequestInvalid          Code = 8000  // a Watch sent where only a stream request is allowed
	CodeWatchLatencyTooHigh          Code = 8001  // Watch: RequestedLatencyMs over the server's maximum (JSON "requested_ms", "max_ms")
	CodeWatchReadIO                  Code = 8002  // Watch: the server failed reading its log (JSON "detail"); the stream ends
	CodeWatchReadSerialization       Code = 8003  // Watch: the server failed decoding its log (JSON "detail"); the stream ends
	CodeWatchReadOther               Code = 8004  // Watch: another server failure (JSON "detail"); the stream ends
	CodeWatchTooManySubscribers      Code = 8005  // Watch: subscriber limit of the shard reached (JSON "active_subscribers", "max_subscribers")
	CodeShardRoutingNoKey            Code = 9000  // the request has no routing key
	CodeShardRoutingMultipleShards   Code = 9001  // a multi-aggregate write spans shards (section 6.9)
	CodeShardRoutingIncompatible     Code = 9002  // incompatible filters, or a Write with empty Writes
	CodeIdentifyInvalidNonce         Code = 10001 // Identify: bad nonce (docs/celeriant-protocol.md section 1.3)
	CodeIdentifyInvalidSignature     Code = 10002 // Identify: bad signature
	CodeIdentifyMismatch             Code = 10003 // ClientID is not the identified client id
	CodeIdentifyRequired             Code = 10004 // this server requires Identify first
	CodeAuthRequired                 Code = 10005 // an API key is required
	CodeAuthInvalidKey               Code = 10006 // the API key is not valid
	CodeAuthInsufficientPermissions  Code = 10007 // the API key lacks the permission
	CodeServerBusy                   Code = 11000 // shard hand-off queue full; ErrBusy, conn stays usable
)

// Error returns "celeriant: error code N" (N in decimal).
func (c Code) Error() string { return "celeriant: error code " + strconv.FormatUint(uint64(c), 10) }

// class returns the class sentinel of c, or nil.
func (c Code) class() error {
	switch c {
	case CodeWriteOCC:
		return ErrConflict
	case CodeWriteClientIdempotency:
		return ErrIdempotencyViolation
	case CodeWriteInflightDuplicate:
		return ErrInflightDuplicate
	case CodeReadUnavailableVersion:
		return ErrUnavailableVersion
	case CodeReadAggregateNotExists, CodeWriteAggregateNotExists, CodeTrimAggregateNotExists, CodeExistsAggregateNotFound:
		return ErrNotFound
	case CodeWriteNotLeader, CodeTrimNotLeader, CodeDeleteNotLeader:
		return ErrNotLeader
	case CodeServerBusy, CodeWriteReplicationBackpressure, CodeTrimBackpressure, CodeDeleteBackpressure:
		return ErrBusy
	}
	return nil
}

// ServerError is an ErrorResponse (response type 7, docs/celeriant-protocol.md section 4.8). The
// structured detail the server puts in Message as JSON is parsed leniently into the
// typed fields; fields the message does not carry stay zero. Match on Code or the class
// sentinels, never on Message.
type ServerError struct {
	// CorrelationID is the request's id echoed by the server; uuid.Nil when absent.
	CorrelationID uuid.UUID
	// Code is the server's error_code (u32 on the wire), see the Code constants.
	Code Code
	// Message is the server's text, usually a small JSON object.
	Message string

	// LastClientSeq is the (aggregate, client) ClientSeq floor, JSON last_client_seq
	// (2002 / 2013, docs/celeriant-protocol.md section 6.4).
	LastClientSeq uint64
	// AttemptedClientSeq is the lowest ClientSeq of the rejected write, JSON
	// attempted_client_seq (2002 / 2013).
	AttemptedClientSeq uint64
	// ExpectedVersion is the write's ExpectedVersion, JSON expected_version (2003).
	ExpectedVersion uint64
	// CurrentVersion is the aggregate's current version (versions count from 1), JSON
	// current_aggregate_version (2003): re-read, re-decide, then write with it.
	CurrentVersion uint64
	// Requested is the refused version, JSON requested: FromVersion for 1000, the trim
	// point for 3004.
	Requested uint64
	// MinimumAvailable is the first readable version, JSON minimum_available (1000):
	// restart the read there (docs/celeriant-protocol.md section 6.6).
	MinimumAvailable uint64
	// LeaderAddress is the leader's host:port, JSON leader_address (2011 / 3005 / 4006);
	// "" when the server does not know it.
	LeaderAddress string
	// NumShards is the server's shard count, JSON num_shards (9001 / 9002): a Watch
	// that cannot be routed to one shard is opened once per shard with ShardID set
	// (docs/celeriant-protocol.md section 6.11).
	NumShards uint64
}

// NewServerError builds the error for code and its server message, parsing the JSON
// detail fields. The simulator and the client both use it, so in-process and TCP errors
// are identical.
func NewServerError(code Code, message string) *ServerError {
	e := &ServerError{Code: code, Message: message}
	var f struct {
		LastClientSeq      *uint64 `json:"last_client_seq"`
		AttemptedClientSeq *uint64 `json:"attempted_client_seq"`
		ExpectedVersion    *uint64 `json:"expected_version"`
		CurrentVersion     *uint64 `json:"current_aggregate_version"`
		Requested          *uint64 `json:"requested"`
		MinimumAvailable   *uint64 `json:"minimum_available"`
		LeaderAddress      *string `json:"leader_address"`
		NumShards          *uint64 `json:"num_shards"`
	}
	// Lenient: some server messages are not valid JSON; then only Message is set.
	if json.Unmarshal([]byte(message), &f) == nil {
		set := func(dst *uint64, src *uint64) {
			if src != nil {
				*dst = *src
			}
		}
		set(&e.LastClientSeq, f.LastClientSeq)
		set(&e.AttemptedClientSeq, f.AttemptedClientSeq)
		set(&e.ExpectedVersion, f.ExpectedVersion)
		set(&e.CurrentVersion, f.CurrentVersion)
		set(&e.Requested, f.Requested)
		set(&e.MinimumAvailable, f.MinimumAvailable)
		set(&e.NumShards, f.NumShards)
		if f.LeaderAddress != nil {
			e.LeaderAddress = *f.LeaderAddress
		}
	}
	return e
}

// Error returns "celeriant: server error <code> (<class>): <message>"; the class part
// is present only for codes with a class sentinel. For logs only: match with errors.Is.
func (e *ServerError) Error() string {
	name := ""
	if c := e.Code.class(); c != nil {
		name = " (" + c.Error()[len("celeriant: "):] + ")"
	}
	return fmt.Sprintf("celeriant: server error %d%s: %s", e.Code, name, e.Message)
}

// Is reports whether target is e's Code, the class sentinel of e's code, or a
// *ServerError with the same code.
func (e *ServerError) Is(target error) bool {
	switch t := target.(type) {
	case Code:
		return t == e.Code
	case *ServerError:
		return t.Code == e.Code
	}
	c := e.Code.class()
	return c != nil && c == target
}

// CodeOf returns the server error code carried by err, or 0.
func CodeOf(err error) Code {
	var se *ServerError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

// IsConflict reports a 2003 optimistic concurrency violation.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsIdempotencyViolation reports 2002.
func IsIdempotencyViolation(err error) bool { return errors.Is(err, ErrIdempotencyViolation) }

// IsInflightDuplicate reports 2013.
func IsInflightDuplicate(err error) bool { return errors.Is(err, ErrInflightDuplicate) }

// IsNotFound reports 1001, 2005 or 7001.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsNotLeader reports 2011, 3005 or 4006 and returns the leader's address ("" if unknown).
func IsNotLeader(err error) (leader string, ok bool) {
	var se *ServerError
	if errors.As(err, &se) && errors.Is(se, ErrNotLeader) {
		return se.LeaderAddress, true
	}
	return "", false
}

// IsBusy reports 11000, 2012, 3006 or 4007.
func IsBusy(err error) bool { return errors.Is(err, ErrBusy) }

// IsUnavailableVersion reports 1000 and returns the minimum available version.
func IsUnavailableVersion(err error) (minimumAvailable uint64, ok bool) {
	var se *ServerError
	if errors.As(err, &se) && se.Code == CodeReadUnavailableVersion {
		return se.MinimumAvailable, true
	}
	return 0, false
}

// IsOutcomeUnknown reports a write that was sent and got no answer.
func IsOutcomeUnknown(err error) bool { return errors.Is(err, ErrOutcomeUnknown) }
