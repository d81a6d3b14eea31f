package sandbox

import (
	"errors"
	"testing"
)

func TestPoolRules(t *testing.T) {
	ok := Pool{Name: "p", Template: Spec{Image: "img", Resources: Resources{CPUMillis: 500}},
		Capacity: Capacity{BufferMin: 1, BufferMax: 2, PoolMax: 4}}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Pool){
		"no name":        func(p *Pool) { p.Name = "" },
		"no image":       func(p *Pool) { p.Template.Image = "" },
		"negative":       func(p *Pool) { p.Capacity.PoolMin = -1 },
		"buffer order":   func(p *Pool) { p.Capacity.BufferMin = 3 },
		"pool order":     func(p *Pool) { p.Capacity.PoolMin = 5 },
		"buffer > pool":  func(p *Pool) { p.Capacity.BufferMax, p.Capacity.PoolMax = 5, 4 },
		"template extra": func(p *Pool) { p.Template.Volumes = []Volume{{Name: "v"}} },
	} {
		p := ok
		mod(&p)
		if err := p.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}

	a := Spec{Image: "img", Env: map[string]string{}}
	b := Spec{Image: "img", Entrypoint: []string{"sleep"}}
	if !SameMembers(&a, &b) {
		t.Error("an empty and a missing environment, or another entrypoint, change the members")
	}
	b.Env = map[string]string{"X": "1"}
	if SameMembers(&a, &b) {
		t.Error("another environment does not change the members")
	}

	if !ok.Satisfies(&Spec{}) || !ok.Satisfies(&Spec{Image: "img", Metadata: map[string]string{"a": "b"}}) {
		t.Error("a create naming the pool, asking for nothing more, is not satisfied")
	}
	for name, s := range map[string]Spec{
		"image":            {Image: "other"},
		"resources":        {Resources: Resources{CPUMillis: 1}},
		"volume":           {Volumes: []Volume{{Name: "v"}}},
		"secure":           {SecureAccess: true},
		"credential proxy": {CredentialProxy: true},
		"platform":         {Platform: &Platform{OS: "linux", Arch: "arm64"}},
		"extension":        {Extensions: map[string]string{"rt": "x"}},
	} {
		if ok.Satisfies(&s, "rt") {
			t.Errorf("%s: satisfied by a warm sandbox", name)
		}
	}
	if !ok.Matches(&Spec{Image: "img", Resources: Resources{CPUMillis: 500}}) {
		t.Error("a plain create of the template's image and resources does not match")
	}
	withEnv := ok
	withEnv.Template.Env = map[string]string{"X": "1"}
	if withEnv.Matches(&Spec{Image: "img", Resources: Resources{CPUMillis: 500}}) || ok.Matches(&Spec{Image: "img"}) {
		t.Error("a template with variables, or other resources, matches a plain create")
	}
}
