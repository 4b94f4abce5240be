package services

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.yaml.in/yaml/v4"
)

// TestK8sRunsTheMeasuredReplicas: deploy/k8s runs the replica counts of
// the production shape that docs/performance.md measured (`claimflow dev
// --shape cluster`), so the figures describe what a user deploys.
func TestK8sRunsTheMeasuredReplicas(t *testing.T) {
	for _, tc := range []struct {
		file, kind string
		want       int
	}{
		{"api-deployment.yaml", "Deployment", ClusterAPIs},
		{"worker-deployment.yaml", "Deployment", ClusterWorkers},
		{"worker-hpa.yaml", "HorizontalPodAutoscaler", ClusterWorkers},
		{"consumer-deployment.yaml", "Deployment", ClusterConsumers},
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "k8s", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Kind string
			Spec struct {
				Replicas    *int `yaml:"replicas"`
				MinReplicas *int `yaml:"minReplicas"`
			}
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		got := doc.Spec.Replicas
		if doc.Kind == "HorizontalPodAutoscaler" {
			got = doc.Spec.MinReplicas
		}
		if doc.Kind != tc.kind || got == nil || *got != tc.want {
			t.Errorf("%s: %s with %v replicas, want a %s with %d", tc.file, doc.Kind, got, tc.kind, tc.want)
		}
	}
}

// TestClusterPostgresIsComposes: the production shape's PostgreSQL runs
// with the settings of compose's postgres service.
func TestClusterPostgresIsComposes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	var settings []string
	cmd := compose.Services["postgres"].Command
	for i := 0; i+1 < len(cmd); i++ {
		if cmd[i] == "-c" {
			settings = append(settings, cmd[i+1])
		}
	}
	if !slices.Equal(settings, ClusterPGSettings) {
		t.Errorf("compose's postgres runs with %v, the production shape with %v", settings, ClusterPGSettings)
	}
}
