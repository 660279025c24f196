package idemgrpc_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkey/idemkey/middleware"
	idemgrpc "github.com/idemkey/idemkey/middleware/grpc"
	"github.com/idemkey/idemkey/store/memory"
)

const watchMethod = "/idemtest.Feed/Watch"

// feedDesc is a server-streaming service: Watch sends the request back twice.
func feedDesc(runs *int) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "idemtest.Feed",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			*runs++
			in := new(wrapperspb.StringValue)
			if err := ss.RecvMsg(in); err != nil {
				return err
			}
			for range 2 {
				if err := ss.SendMsg(in); err != nil {
					return err
				}
			}
			return nil
		}}},
	}
}

// Every call carrying the key in binary form is refused INVALID_ARGUMENT
// before its handler runs, with or without a text key beside it: it is never
// run unprotected.
func TestBinaryKeyRefused(t *testing.T) {
	svc := &service{}
	conn := serve(t, newInterceptor(t, memory.New()), svc)
	for _, bin := range []string{"k", "", "\x00\xff", strings.Repeat("a", 300)} {
		for _, text := range []string{"", "k"} {
			ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.KeyMetadataBin, bin)
			_, _, err := call(ctx, conn, chargeMethod, text, "x")
			wantProblem(t, err, codes.InvalidArgument, middleware.CodeKeyInvalid)
		}
	}
	if n := svc.calls.Load(); n != 0 {
		t.Fatalf("%d runs", n)
	}
}

// A streaming call with a key is refused (never run as if protected); one
// without a key streams.
func TestStreamWithKeyRefused(t *testing.T) {
	ic := newInterceptor(t, memory.New())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	runs := 0
	srv.RegisterService(feedDesc(&runs), nil)
	if err := ic.Check(srv); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	watch := func(ctx context.Context) (int, error) {
		st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, watchMethod)
		if err != nil {
			return 0, err
		}
		if err := st.SendMsg(wrapperspb.String("x")); err != nil {
			return 0, err
		}
		st.CloseSend()
		n := 0
		for {
			if err := st.RecvMsg(new(wrapperspb.StringValue)); err != nil {
				if n == 2 {
					return n, nil
				}
				return n, err
			}
			n++
		}
	}
	for _, md := range [][]string{{idemgrpc.KeyMetadata, "k"}, {idemgrpc.KeyMetadataBin, "k"}} {
		_, err := watch(metadata.AppendToOutgoingContext(context.Background(), md...))
		wantProblem(t, err, codes.InvalidArgument, middleware.CodeKeyInvalid)
	}
	if runs != 0 {
		t.Fatalf("%d stream runs with a key", runs)
	}
	if n, err := watch(context.Background()); err != nil || n != 2 {
		t.Fatalf("without a key: %d messages, %v", n, err)
	}
}

// Check fails at startup for a configuration that leaves a call unprotected
// without saying so.
func TestCheckRegistration(t *testing.T) {
	runs := 0
	build := func(withStream bool, opts ...idemgrpc.Option) error {
		ic := newInterceptor(t, memory.New(), opts...)
		sopts := []grpc.ServerOption{grpc.UnaryInterceptor(ic.Unary())}
		if withStream {
			sopts = append(sopts, grpc.StreamInterceptor(ic.Stream()))
		}
		srv := grpc.NewServer(sopts...)
		srv.RegisterService(&serviceDesc, &service{})
		srv.RegisterService(feedDesc(&runs), nil)
		return ic.Check(srv)
	}
	for name, c := range map[string]struct {
		stream bool
		opts   []idemgrpc.Option
		ok     bool
	}{
		"streams without Stream": {false, nil, false},
		"streams with Stream":    {true, nil, true},
		"WithMethods a stream":   {true, []idemgrpc.Option{idemgrpc.WithMethods(chargeMethod, watchMethod)}, false},
		"WithMethods a typo":     {true, []idemgrpc.Option{idemgrpc.WithMethods("/idemtest.Payments/Chrage")}, false},
		"WithMethods unary only": {true, []idemgrpc.Option{idemgrpc.WithMethods(chargeMethod, readMethod)}, true},
	} {
		if err := build(c.stream, c.opts...); (err == nil) != c.ok {
			t.Errorf("%s: Check = %v", name, err)
		}
	}
}
