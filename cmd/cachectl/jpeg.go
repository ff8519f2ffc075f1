package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"math"
	"math/rand/v2"
)

// jpegQuality is the quality gendata encodes at: about what cameras and
// ImageNet's files use.
const jpegQuality = 85

// photoJPEGs makes small photo-like JPEGs of about a requested size: a smooth
// colour gradient (random corner colours, bilinear) under per-pixel noise, so
// that decoders do real work and the file is not all headers. The size is
// honoured roughly: a JPEG of such an image grows with its pixel count, so
// each image gets width×height ≈ want / bytes-per-pixel, the ratio learned
// from the images made so far (it starts from a measured one and settles
// within a few images). Within ±10% on average; a small target (a few KiB)
// is larger, as the headers alone take about 600 bytes.
type photoJPEGs struct {
	r              *rand.Rand
	bytes, pixels  float64 // made so far: the bytes-per-pixel estimate
	buf            bytes.Buffer
	minSide        int
	noiseAmplitude int
}

func newPhotoJPEGs(r *rand.Rand) (*photoJPEGs, error) {
	p := &photoJPEGs{r: r, minSide: 8, noiseAmplitude: 24}
	// Calibrate on one mid-sized image so the first sizes are close too.
	b, err := p.encode(96, 72)
	if err != nil {
		return nil, err
	}
	p.bytes, p.pixels = float64(len(b)), 96*72
	return p, nil
}

// next returns a JPEG of about want bytes (4:3, at least minSide square).
func (p *photoJPEGs) next(want int) ([]byte, error) {
	bpp := p.bytes / p.pixels
	px := float64(want) / bpp
	// w = 4k, h = 3k: 12k² = px.
	k := max(1, int(math.Sqrt(px/12)+0.5))
	w, h := max(p.minSide, 4*k), max(p.minSide, 3*k)
	b, err := p.encode(w, h)
	if err != nil {
		return nil, err
	}
	p.bytes += float64(len(b))
	p.pixels += float64(w * h)
	return b, nil
}

func (p *photoJPEGs) encode(w, h int) ([]byte, error) {
	img := image.NewYCbCr(image.Rect(0, 0, w, h), image.YCbCrSubsampleRatio420)
	var corner [4][3]float64
	for i := range corner {
		for c := range corner[i] {
			corner[i][c] = float64(p.r.IntN(256))
		}
	}
	span := uint64(2*p.noiseAmplitude + 1)
	for y := range h {
		fy := float64(y) / float64(max(h-1, 1))
		var left, right [3]float64
		for c := range left {
			left[c] = (1-fy)*corner[0][c] + fy*corner[2][c]
			right[c] = (1-fy)*corner[1][c] + fy*corner[3][c]
		}
		for x := range w {
			fx := float64(x) / float64(max(w-1, 1))
			v := p.r.Uint64() // three noise values from one draw
			var rgb [3]uint8
			for c := range rgb {
				n := int((v>>(16*c))&0xffff%span) - p.noiseAmplitude
				rgb[c] = uint8(min(max((1-fx)*left[c]+fx*right[c]+float64(n), 0), 255))
			}
			yy, cb, cr := color.RGBToYCbCr(rgb[0], rgb[1], rgb[2])
			img.Y[img.YOffset(x, y)] = yy
			ci := img.COffset(x, y)
			img.Cb[ci], img.Cr[ci] = cb, cr // 4:2:0: the last pixel of each 2×2 block sets its chroma
		}
	}
	p.buf.Reset()
	if err := jpeg.Encode(&p.buf, img, &jpeg.Options{Quality: jpegQuality}); err != nil {
		return nil, fmt.Errorf("encoding a %dx%d JPEG: %w", w, h, err)
	}
	return bytes.Clone(p.buf.Bytes()), nil
}
