package main

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/dustin/go-humanize"

	"stallfree/client"
	"stallfree/stall"
)

// gendata writes a synthetic image-like dataset: N items in class folders,
// sizes spread uniformly over [0.5, 1.5) × --size. --format files writes
// noise (img_N.bin), --format jpeg real photo-like JPEGs (img_N.jpg, which
// Pillow and torchvision decode), --format tar WebDataset shards whose .jpg
// members are such JPEGs. A JPEG's size follows --size roughly (photoJPEGs).
func (a *app) gendata(args []string) error {
	fs := flag.NewFlagSet("gendata", flag.ContinueOnError)
	items := fs.Int("items", 2000, "number of items")
	size := fs.String("size", "110KiB", "mean item size (a JPEG's is approximate: its pixel count is chosen for it)")
	classes := fs.Int("classes", 10, "number of classes (class folders classNNN)")
	seed := fs.Uint64("seed", 1, "random seed")
	format := fs.String("format", "files", "files (noise, img_N.bin), jpeg (real JPEGs, img_N.jpg) or tar (WebDataset shards of .jpg/.cls/.json samples, the .jpg real JPEGs)")
	perShard := fs.Int("shard-samples", 100, "samples per tar shard (--format tar)")
	pos, err := parseCommand(fs, args, 1, "gendata DIR [--items N --size 110KiB --classes C --format files|jpeg|tar --shard-samples N]")
	if err != nil {
		return err
	}
	dirName := pos[0]
	mean, err := humanize.ParseBytes(*size)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *items < 0 || *perShard < 1 {
		return fmt.Errorf("--items and --shard-samples: want --items >= 0 and --shard-samples >= 1")
	}
	r := rand.New(rand.NewPCG(*seed, 42))
	sizeOf := func() int { return int(float64(mean) * (0.5 + r.Float64())) } // uniform in [0.5, 1.5) x mean
	noise := func() ([]byte, error) {
		n := sizeOf()
		b := make([]byte, n)
		for j := 0; j < n; j += 8 {
			v := r.Uint64()
			for k := 0; k < 8 && j+k < n; k++ {
				b[j+k] = byte(v >> (8 * k))
			}
		}
		return b, nil
	}
	var photo func() ([]byte, error) // --format jpeg and tar
	if *format == "jpeg" || *format == "tar" {
		jp, err := newPhotoJPEGs(r)
		if err != nil {
			return err
		}
		photo = func() ([]byte, error) { return jp.next(sizeOf()) }
	}
	var total uint64
	switch *format {
	case "files", "jpeg":
		payload, ext := noise, "bin"
		if *format == "jpeg" {
			payload, ext = photo, "jpg"
		}
		for i := range *items {
			dir := filepath.Join(dirName, fmt.Sprintf("class%03d", i%max(*classes, 1)))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			b, err := payload()
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("img_%07d.%s", i, ext)), b, 0o644); err != nil {
				return err
			}
			total += uint64(len(b))
		}
	case "tar":
		if total, err = writeShards(dirName, *items, *perShard, max(*classes, 1), photo); err != nil {
			return err
		}
		fmt.Fprintf(a.out, "wrote %d samples in %d shards (%s) to %s\n", *items, (*items+*perShard-1) / *perShard, humanize.IBytes(total), dirName)
		return nil
	default:
		return usageError{fmt.Sprintf("--format %q: want files, jpeg or tar", *format)}
	}
	fmt.Fprintf(a.out, "wrote %d items (%s) to %s\n", *items, humanize.IBytes(total), dirName)
	return nil
}

// writeShards writes WebDataset shards train-NNNNNN.tar of perShard samples,
// each sample a .jpg (from jpg), a .cls (its class) and a .json.
func writeShards(dir string, samples, perShard, classes int, jpg func() ([]byte, error)) (uint64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	var total uint64
	for first := 0; first < samples; first += perShard {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("train-%06d.tar", first/perShard)))
		if err != nil {
			return 0, err
		}
		tw := tar.NewWriter(f)
		for i := first; i < min(first+perShard, samples); i++ {
			key := fmt.Sprintf("s%07d", i)
			img, err := jpg()
			if err != nil {
				f.Close()
				return 0, err
			}
			members := []struct {
				ext  string
				data []byte
			}{
				{"jpg", img},
				{"cls", fmt.Appendf(nil, "%d", i%classes)},
				{"json", fmt.Appendf(nil, `{"class":%d,"index":%d}`, i%classes, i)},
			}
			for _, m := range members {
				hdr := &tar.Header{Name: key + "." + m.ext, Mode: 0o644, Size: int64(len(m.data)), Typeflag: tar.TypeReg}
				if err := tw.WriteHeader(hdr); err != nil {
					f.Close()
					return 0, err
				}
				if _, err := tw.Write(m.data); err != nil {
					f.Close()
					return 0, err
				}
				total += uint64(len(m.data))
			}
		}
		if err := tw.Close(); err != nil {
			f.Close()
			return 0, err
		}
		if err := f.Close(); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// epoch reads a whole dataset in a fresh random order with several workers,
// like a data loader, and reports throughput and where items came from. With
// --verify DIR every item is compared with the file it came from.
func (a *app) epoch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("epoch", flag.ContinueOnError)
	workers := fs.Int("workers", 8, "concurrent requests")
	epochs := fs.Int("epochs", 1, "number of epochs")
	seed := fs.Uint64("seed", 1, "shuffle seed")
	verify := fs.String("verify", "", "directory holding the dataset's files, to check every byte")
	route := fs.String("route", "local", "local (every read through --node) or owner (each read from the node owning the item)")
	pos, err := parseCommand(fs, args, 1, "epoch NAME [--epochs N --workers W --verify DIR --route local|owner]")
	if err != nil {
		return err
	}
	name := pos[0]
	reader := a.c
	switch *route {
	case "local":
	case "owner":
		routed := *a.c
		reader = routed.RouteByOwner()
	default:
		return usageError{fmt.Sprintf("--route %q: want local or owner", *route)}
	}
	d, err := a.c.Dataset(ctx, name)
	if err != nil {
		return err
	}
	var check func(client.Item) bool
	if *verify != "" {
		check = func(it client.Item) bool {
			want, err := os.ReadFile(filepath.Join(*verify, filepath.FromSlash(it.Key)))
			return err == nil && bytes.Equal(want, it.Data)
		}
	}
	type result struct {
		Epoch   int     `json:"epoch"`
		Items   int     `json:"items"`
		Bytes   int64   `json:"bytes"`
		Seconds float64 `json:"seconds"`
		Hit     int     `json:"hit"`
		Peer    int     `json:"peer"`
		Miss    int     `json:"miss"`
		Wrong   int     `json:"wrong"`
	}
	var results []result
	for e := range *epochs {
		order := rand.New(rand.NewPCG(*seed, uint64(e))).Perm(d.Items)
		rd, err := stall.Read(ctx, reader, name, order, stall.ReadOptions{Workers: *workers, Check: check})
		if err != nil {
			return err
		}
		res := result{Epoch: e, Items: len(order), Bytes: rd.Bytes, Seconds: rd.Elapsed.Seconds(),
			Hit: rd.Count("hit"), Peer: rd.Count("peer"), Miss: rd.Count("miss"), Wrong: rd.Wrong}
		results = append(results, res)
		if !a.json {
			fmt.Fprintf(a.out, "epoch %d: %d items, %s in %.2fs = %.0f items/s, %s/s; hit %d, peer %d, miss %d",
				e, res.Items, humanize.IBytes(uint64(res.Bytes)), res.Seconds, float64(res.Items)/res.Seconds,
				humanize.IBytes(uint64(float64(res.Bytes)/res.Seconds)), res.Hit, res.Peer, res.Miss)
			if *verify != "" {
				fmt.Fprintf(a.out, "; wrong bytes in %d items", res.Wrong)
			}
			fmt.Fprintln(a.out)
		}
		if res.Wrong > 0 {
			return fmt.Errorf("epoch %d: %d items differ from the source", e, res.Wrong)
		}
	}
	if a.json {
		return a.printJSON(results)
	}
	return nil
}
