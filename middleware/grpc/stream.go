package idemgrpc

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// Stream returns the stream server interceptor, for grpc.StreamInterceptor or
// grpc.ChainStreamInterceptor. The interceptor protects unary methods only: a
// stream has no one request to fingerprint nor one answer to replay. So that
// no stream runs unprotected while its client believes it is protected, a
// streaming call that carries a key (KeyMetadata or KeyMetadataBin) is refused
// INVALID_ARGUMENT idempotency_key_invalid before its handler runs; a
// streaming call without one passes through. Protect a server-streaming
// operation by starting it with a unary call that carries the key (the
// unary call does the side effect once and returns an id; the stream reads
// by that id).
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor {
	ic.streamAsked.Store(true)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		if len(md.Get(ic.keyMD)) > 0 || len(md.Get(ic.keyMD+"-bin")) > 0 {
			return problem(codes.InvalidArgument, codeKeyInvalid, fmt.Sprintf(
				"%s is a streaming method, which idempotency keys do not protect; send the key on a unary call", info.FullMethod), 0)
		}
		return handler(srv, ss)
	}
}

// Check reports, after the services are registered on srv and before it
// serves, a configuration that would leave a call unprotected without
// saying so: a method named by WithMethods that srv does not serve (a typo),
// or that is a streaming method; or a streaming method served while Stream
// was never asked for (a key sent on it would be ignored). Call it where the
// server is built, so the mistake fails at startup.
func (ic *Interceptor) Check(srv *grpc.Server) error {
	kinds := make(map[string]bool) // full method -> streaming
	for name, svc := range srv.GetServiceInfo() {
		for _, m := range svc.Methods {
			full := "/" + name + "/" + m.Name
			kinds[full] = m.IsClientStream || m.IsServerStream
			if kinds[full] && !ic.streamAsked.Load() {
				return fmt.Errorf("idemkey/middleware/grpc: the server serves the streaming method %s without the stream interceptor (Stream), so a key sent on it would be ignored", full)
			}
		}
	}
	for m := range ic.methods {
		streaming, ok := kinds[m]
		switch {
		case !ok:
			return fmt.Errorf("idemkey/middleware/grpc: WithMethods names %s, which the server does not serve", m)
		case streaming:
			return fmt.Errorf("idemkey/middleware/grpc: WithMethods names %s, a streaming method: idempotency keys protect unary methods only (start the stream with a unary call that carries the key)", m)
		}
	}
	return nil
}
