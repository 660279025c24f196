package idemgrpc_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	idemgrpc "github.com/idemkey/idemkey/middleware/grpc"
)

// The test service: /idemtest.Payments/Charge and /idemtest.Payments/Read take
// and return a wrapperspb.StringValue, so no code is generated.
const (
	chargeMethod = "/idemtest.Payments/Charge"
	readMethod   = "/idemtest.Payments/Read"
)

type service struct {
	calls atomic.Int32
	// fn answers a call; nil echoes "charged " + the request.
	fn func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
}

func (s *service) answer(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	s.calls.Add(1)
	if s.fn != nil {
		return s.fn(ctx, in)
	}
	return wrapperspb.String("charged " + in.GetValue()), nil
}

func unaryHandler(method string) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		s := srv.(*service)
		h := func(ctx context.Context, req any) (any, error) { return s.answer(ctx, req.(*wrapperspb.StringValue)) }
		if interceptor == nil {
			return h(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, h)
	}
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "idemtest.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Charge", Handler: unaryHandler(chargeMethod)},
		{MethodName: "Read", Handler: unaryHandler(readMethod)},
	},
}

// serve starts a gRPC server on a loopback port with ic's interceptor and
// returns a client connection to it; both end with the test.
func serve(t testing.TB, ic *idemgrpc.Interceptor, svc *service) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	srv.RegisterService(&serviceDesc, svc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// call invokes method with the request value and key ("" sends none) and
// returns the response value, the header metadata and the error.
func call(ctx context.Context, conn *grpc.ClientConn, method, key, value string) (string, metadata.MD, error) {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.KeyMetadata, key)
	}
	var hdr metadata.MD
	out := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, method, wrapperspb.String(value), out, grpc.Header(&hdr))
	return out.GetValue(), hdr, err
}
