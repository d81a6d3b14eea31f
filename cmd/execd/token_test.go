package main

import (
	"strings"
	"testing"
)

func TestStripTokenArgs(t *testing.T) {
	tests := []struct {
		args, want string
		token      string
		found      bool
	}{
		{"--port 1 --access-token abc -- cmd --access-token x", "--port 1 -- cmd --access-token x", "abc", true},
		{"--access-token=abc --insecure", "--insecure", "abc", true},
		{"-access-token abc", "", "abc", true},
		{"-access-token=a=b", "", "a=b", true},
		{"--access-token-file /x --port 2", "--access-token-file /x --port 2", "", false},
		{"-- --access-token abc", "-- --access-token abc", "", false},
		{"--access-token", "--access-token", "", false},
	}
	for _, tt := range tests {
		out, token, found := stripTokenArgs(strings.Fields(tt.args))
		if strings.Join(out, " ") != tt.want || token != tt.token || found != tt.found {
			t.Errorf("stripTokenArgs(%q) = %q, %q, %v; want %q, %q, %v", tt.args, out, token, found, tt.want, tt.token, tt.found)
		}
	}
}
