package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	idemgrpc "github.com/idemkey/idemkey/middleware/grpc"
	"github.com/idemkey/idemkey/store/memory"
)

// A payment method behind the interceptor: the retry with the same key gets the
// first answer without a second charge, and the key reused for another amount
// is FAILED_PRECONDITION.
func Example() {
	ic, err := idemgrpc.New(memory.New(), idemgrpc.GlobalScope, idemgrpc.WithMethods(chargeMethod))
	if err != nil {
		panic(err)
	}
	svc := &service{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	srv.RegisterService(&serviceDesc, svc)
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()
	conn, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()

	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.KeyMetadata, "8e03978e-40d5-43e8-bc93-6894a57f9324")
	for _, amount := range []string{"5 EUR", "5 EUR", "7 EUR"} {
		var hdr metadata.MD
		out := new(wrapperspb.StringValue)
		err := conn.Invoke(ctx, chargeMethod, wrapperspb.String(amount), out, grpc.Header(&hdr))
		if err != nil {
			fmt.Println(status.Code(err))
			continue
		}
		fmt.Println(out.GetValue(), "replayed:", hdr.Get(idemgrpc.ReplayedMetadata))
	}
	fmt.Println("handler ran", svc.calls.Load(), "time(s)")
	// Output:
	// charged 5 EUR replayed: []
	// charged 5 EUR replayed: [true]
	// FailedPrecondition
	// handler ran 1 time(s)
}
