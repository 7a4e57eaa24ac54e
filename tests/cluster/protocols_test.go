package cluster

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
	ping "knative.dev/serving/test/test_images/grpc-ping/proto"
)

// activatorAlways keeps the activator in a revision's path at any scale.
var activatorAlways = map[string]string{"autoscaling.knative.dev/target-burst-capacity": "-1"}

// A WebSocket through the ingress, the activator and the queue-proxy to an
// echo app: upgraded, and messages both ways.
func TestWebSocketThroughIngressAndActivator(t *testing.T) {
	t.Parallel()
	svc := create(t, service{name: "websocket", image: image("wsserver"), annotations: activatorAlways})
	eventually(t, "the activator in the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeProxy, nil
	})
	conn := dialWebSocket(t, svc.name)
	defer conn.Close()
	for _, message := range []string{"hello", "from qproxy's cluster tests"} {
		if err := conn.WriteMessage(websocket.TextMessage, []byte(message)); err != nil {
			t.Fatalf("writing %q: %v", message, err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		kind, got, err := conn.ReadMessage()
		if err != nil || kind != websocket.TextMessage || string(got) != message {
			t.Fatalf("echo of %q: %q (type %d) %v", message, got, kind, err)
		}
	}
}

// dialWebSocket opens a WebSocket to the Service `name` through the
// ingress, failing the test if the handshake fails.
func dialWebSocket(t *testing.T, name string) *websocket.Conn {
	t.Helper()
	dialer := websocket.Dialer{
		NetDial:          func(network, _ string) (net.Conn, error) { return net.Dial(network, ingress) },
		HandshakeTimeout: time.Minute,
	}
	conn, resp, err := dialer.Dial("ws://"+host(name)+"/", nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("WebSocket handshake through the ingress: %v (status %d)", err, status)
	}
	return conn
}

// gRPC (h2c) through the ingress, the activator and the queue-proxy: a
// unary call and a stream.
func TestGRPCThroughIngressAndActivator(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:        "grpc",
		image:       image("grpc-ping"),
		port:        namedPort("h2c", 8080),
		annotations: activatorAlways,
	})
	eventually(t, "the activator in the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeProxy, nil
	})
	conn, err := grpc.NewClient("passthrough:///"+ingress,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority(host(svc.name)))
	if err != nil {
		t.Fatalf("gRPC client: %v", err)
	}
	defer conn.Close()
	pinger := ping.NewPingServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	got, err := pinger.Ping(ctx, &ping.Request{Msg: "unary"})
	if err != nil || got.Msg != "unary" {
		t.Fatalf("unary Ping: %v %v", got, err)
	}
	stream, err := pinger.PingStream(ctx)
	if err != nil {
		t.Fatalf("PingStream: %v", err)
	}
	for _, message := range []string{"one", "two", "three"} {
		if err := stream.Send(&ping.Request{Msg: message}); err != nil {
			t.Fatalf("sending %q on the stream: %v", message, err)
		}
		got, err := stream.Recv()
		if err != nil || got.Msg != message {
			t.Fatalf("the stream's answer to %q: %v %v", message, got, err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("closing the stream: %v", err)
	}
}
