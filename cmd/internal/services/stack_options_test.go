package services

import "testing"

func TestChooseServices(t *testing.T) {
	tests := []struct {
		list                      string
		noAPI, noWorker, noConsum bool
		wantErr                   bool
	}{
		{list: "api,worker,consumer"},
		{list: "api, worker", noConsum: true},
		{list: "worker", noAPI: true, noConsum: true},
		{list: "none", noAPI: true, noWorker: true, noConsum: true},
		{list: "api,scheduler", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.list, func(t *testing.T) {
			var o StackOptions
			err := o.ChooseServices(tt.list)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v, want error: %v", err, tt.wantErr)
			}
			if err == nil && (o.NoAPI != tt.noAPI || o.NoWorker != tt.noWorker || o.NoConsumer != tt.noConsum) {
				t.Fatalf("NoAPI=%v NoWorker=%v NoConsumer=%v, want %v %v %v",
					o.NoAPI, o.NoWorker, o.NoConsumer, tt.noAPI, tt.noWorker, tt.noConsum)
			}
		})
	}
}
