package simserver

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

func TestDurationJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{`"250ms"`, 250 * time.Millisecond, true},
		{`"2s"`, 2 * time.Second, true},
		{`1000`, time.Microsecond, true},
		{`"soon"`, 0, false},
		{`true`, 0, false},
	} {
		var d Duration
		err := json.Unmarshal([]byte(tc.in), &d)
		if (err == nil) != tc.ok || time.Duration(d) != tc.want {
			t.Errorf("%s = %s, %v; want %s (ok %v)", tc.in, time.Duration(d), err, tc.want, tc.ok)
		}
	}
	b, err := json.Marshal(Duration(1500 * time.Millisecond))
	if err != nil || string(b) != `"1.5s"` {
		t.Errorf("marshal = %s, %v", b, err)
	}
}

func TestListenServesUntilClosed(t *testing.T) {
	l, err := Listen("test simulator", "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusTeapot, map[string]string{"ok": "yes"})
	}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(l.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("answer %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(l.URL); err == nil {
		t.Error("still serving after Close")
	}
	if _, err := Listen("test simulator", l.URL[len("http://"):], nil); err != nil {
		t.Errorf("address not freed: %v", err)
	}
	var never *Listener
	if err := never.Close(context.Background()); err != nil {
		t.Errorf("nil listener: %v", err)
	}
}
