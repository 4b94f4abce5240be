package main

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSink is an OTLP/HTTP trace receiver standing in for compose's Jaeger:
// it keeps, per trace ID, the service names whose spans arrived.
type otlpSink struct {
	addr string

	mu     sync.Mutex
	traces map[string]map[string]int // trace ID -> service.name -> spans
}

func startOTLPSink(t *testing.T) *otlpSink {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &otlpSink{addr: l.Addr().String(), traces: map[string]map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.add(&req)
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *otlpSink) add(req *collectortrace.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				id := hex.EncodeToString(sp.GetTraceId())
				if s.traces[id] == nil {
					s.traces[id] = map[string]int{}
				}
				s.traces[id][service]++
			}
		}
	}
}

// services is how many traces each service sent spans for, and how many
// traces hold spans of every one of want.
func (s *otlpSink) services(want ...string) (perService map[string]int, spanning int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	perService = map[string]int{}
	for _, svcs := range s.traces {
		all := true
		for _, w := range want {
			if svcs[w] == 0 {
				all = false
			}
		}
		if all {
			spanning++
		}
		for svc := range svcs {
			perService[svc]++
		}
	}
	return perService, spanning
}
